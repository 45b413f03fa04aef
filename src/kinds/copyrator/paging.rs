//! Lists of ConfigMaps and Secrets read page by page (`limit` and continue
//! tokens), every response under a byte cap ([`PAGE_BYTES`]) and every page
//! under the process-wide [`Budget`], so that what a rule's reads hold is
//! bounded before the bytes arrive:
//!
//! - a rule's sources are measured page by page against the rule's limit
//!   (its share of `--copyrator-max-bytes`), each page dropped once counted;
//!   reading stops at the first page that goes over ([`ReadError::Over`]).
//!   Sources that come in one page are kept as read; more pages are read a
//!   second time, once the bytes they take are held from the budget;
//! - a rule's own copies are kept only as fingerprints (a digest per value),
//!   one page at a time.
//!
//! The page walk is generic over how a page is fetched, so it is tested
//! here without a cluster; `observe` fetches from the API.

use std::future::Future;
use std::ops::ControlFlow;

use super::budget::{Budget, BudgetError, Hold, PAGE_BYTES, PAGE_COST};
use super::inputs::Object;
use crate::kind::HandlerError;

/// Objects the first page of a list asks for.
pub const FIRST_LIMIT: u32 = 100;
/// The most objects one page asks for.
pub const MAX_LIMIT: u32 = 500;

/// One page of a list, as read.
#[derive(Debug, Default)]
pub struct Page {
    /// Its objects.
    pub objects: Vec<Object>,
    /// The bytes its response took.
    pub bytes: usize,
    /// The continue token, when more pages follow.
    pub next: Option<String>,
}

/// Why a page was not read.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// The response took more than [`PAGE_BYTES`]; what came was dropped.
    #[error("the response took more than {PAGE_BYTES} bytes")]
    TooBig,
    /// The request failed.
    #[error(transparent)]
    Failed(HandlerError),
}

/// The content bytes read so far against a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// The most bytes allowed.
    pub limit: usize,
    /// The bytes counted.
    pub bytes: usize,
    /// The objects counted.
    pub objects: usize,
}

impl Tally {
    /// Nothing counted yet.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            bytes: 0,
            objects: 0,
        }
    }

    /// Counts one object of `bytes`; false once the total is over the limit.
    pub fn add(&mut self, bytes: usize) -> bool {
        self.bytes = self.bytes.saturating_add(bytes);
        self.objects += 1;
        !self.over()
    }

    /// True when the bytes counted are more than the limit.
    pub fn over(&self) -> bool {
        self.bytes > self.limit
    }
}

/// Why a list was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The sources hold more than the rule's limit; reading stopped there.
    #[error("more than {} bytes (reading stopped after {} objects, {} bytes)", .0.limit, .0.objects, .0.bytes)]
    Over(Tally),
    /// One object's JSON takes more than a page.
    #[error("one object takes more than {PAGE_BYTES} bytes of JSON")]
    ObjectTooBig,
    /// The budget cannot cover what the sources take.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The sources grew between the measuring and the reading.
    #[error("the sources changed while they were read")]
    Changed,
    /// A request failed.
    #[error(transparent)]
    Failed(#[from] HandlerError),
}

/// The limit to ask for after a page of `objects` whose response took
/// `bytes`: as many objects of that average size as fill half a page.
pub fn next_limit(bytes: usize, objects: usize) -> u32 {
    if objects == 0 {
        return MAX_LIMIT;
    }
    let average = bytes.div_ceil(objects).max(1);
    u32::try_from(PAGE_BYTES / (2 * average))
        .unwrap_or(MAX_LIMIT)
        .clamp(1, MAX_LIMIT)
}

/// The limit to ask for again after a response over the cap: a quarter;
/// none when a single object was asked for.
pub fn smaller(limit: u32) -> Option<u32> {
    (limit > 1).then(|| (limit / 4).max(1))
}

/// Where the budget of the pages of a walk comes from.
#[derive(Clone, Copy, Debug)]
pub enum Permits<'a> {
    /// Each page takes [`PAGE_COST`] from the budget while it is read.
    PerPage(&'a Budget),
    /// A hold taken before covers the pages.
    Covered,
}

/// One page handed to a walk's visitor.
#[derive(Debug)]
pub struct Visit {
    /// The page.
    pub page: Page,
    /// The budget it was read under (with [`Permits::PerPage`]).
    pub permit: Option<Hold>,
    /// It is the list's first page.
    pub first: bool,
}

/// Reads a list page by page with `fetch(continue token, limit)`, the first
/// page asking for `limit` objects, handing each page to `visit` until the
/// list ends or `visit` breaks. A response over the cap is asked for again
/// with fewer objects. Returns the limit the first page was read with.
pub async fn walk<F, Fut, V>(
    fetch: &F,
    permits: Permits<'_>,
    limit: u32,
    mut visit: V,
) -> Result<u32, ReadError>
where
    F: Fn(Option<String>, u32) -> Fut,
    Fut: Future<Output = Result<Page, PageError>>,
    V: FnMut(Visit) -> ControlFlow<()>,
{
    let (mut token, mut limit) = (None, limit);
    let mut first_limit = None;
    loop {
        let permit = match permits {
            Permits::PerPage(budget) => Some(budget.acquire(PAGE_COST).await?),
            Permits::Covered => None,
        };
        let page = match fetch(token.clone(), limit).await {
            Ok(page) => page,
            Err(PageError::TooBig) => {
                limit = smaller(limit).ok_or(ReadError::ObjectTooBig)?;
                continue;
            }
            Err(PageError::Failed(e)) => return Err(e.into()),
        };
        let read_with = *first_limit.get_or_insert(limit);
        limit = next_limit(page.bytes, page.objects.len());
        let next = page.next.clone();
        let flow = visit(Visit {
            page,
            permit,
            first: token.is_none(),
        });
        match next {
            Some(t) if flow.is_continue() => token = Some(t),
            _ => return Ok(read_with),
        }
    }
}

/// A rule's sources and the budget they hold.
#[derive(Debug)]
pub struct Sources {
    /// The sources.
    pub objects: Vec<Object>,
    /// What they hold of the budget, until dropped.
    pub hold: Hold,
}

/// Reads a rule's sources, `limit` content bytes at most (counted as
/// [`Object::content_bytes`]): measured page by page first, so that a rule
/// over its limit is known without its sources ever being held together.
pub async fn read_sources<F, Fut>(
    fetch: &F,
    budget: &Budget,
    limit: usize,
) -> Result<Sources, ReadError>
where
    F: Fn(Option<String>, u32) -> Fut,
    Fut: Future<Output = Result<Page, PageError>>,
{
    let mut tally = Tally::new(limit);
    let (mut raw, mut largest) = (0usize, 0usize);
    let mut kept = None;
    let fits = walk(fetch, Permits::PerPage(budget), FIRST_LIMIT, |visit| {
        let Visit {
            page,
            permit,
            first,
        } = visit;
        if !page.objects.iter().all(|o| tally.add(o.content_bytes())) {
            return ControlFlow::Break(());
        }
        raw += page.bytes;
        largest = largest.max(page.bytes);
        if let Some(mut hold) = permit.filter(|_| first && page.next.is_none()) {
            // The whole list in one page: keep it as read.
            hold.shrink_to(page.bytes);
            kept = Some(Sources {
                objects: page.objects,
                hold,
            });
        }
        ControlFlow::Continue(())
    })
    .await?;
    if tally.over() {
        return Err(ReadError::Over(tally));
    }
    if let Some(sources) = kept {
        return Ok(sources);
    }
    // Several pages: hold what they take (and one page more while it is
    // parsed), then read them again, keeping them.
    let allowed = raw + largest;
    let hold = budget.acquire(allowed).await?;
    let (mut again, mut read, mut changed) = (Tally::new(limit), 0usize, false);
    let mut objects = Vec::new();
    walk(fetch, Permits::Covered, fits, |Visit { page, .. }| {
        read += page.bytes;
        changed = read > allowed;
        if changed || !page.objects.iter().all(|o| again.add(o.content_bytes())) {
            return ControlFlow::Break(());
        }
        objects.extend(page.objects);
        ControlFlow::Continue(())
    })
    .await?;
    if again.over() {
        Err(ReadError::Over(again))
    } else if changed {
        Err(ReadError::Changed)
    } else {
        Ok(Sources { objects, hold })
    }
}

/// Reads a rule's copies, keeping each as its fingerprint
/// ([`Object::fingerprinted`]): their data is never held beyond its page.
pub async fn read_copies<F, Fut>(fetch: &F, budget: &Budget) -> Result<Vec<Object>, ReadError>
where
    F: Fn(Option<String>, u32) -> Fut,
    Fut: Future<Output = Result<Page, PageError>>,
{
    let mut copies = Vec::new();
    walk(
        fetch,
        Permits::PerPage(budget),
        FIRST_LIMIT,
        |Visit { page, .. }| {
            copies.extend(page.objects.into_iter().map(Object::fingerprinted));
            ControlFlow::Continue(())
        },
    )
    .await?;
    Ok(copies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::copyrator::inputs::Content;
    use crate::kinds::copyrator::resource::RuleType;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    const MIB: usize = 1024 * 1024;
    /// What the fake counts per object besides its value (metadata).
    const OVERHEAD: usize = 200;

    /// A list served from memory, recording what was asked and how much of
    /// the budget was free at each request.
    struct Fake<'a> {
        sizes: Mutex<Vec<usize>>,
        budget: &'a Budget,
        asked: Mutex<Vec<(Option<String>, u32, usize)>>,
        /// Added to every object's size after the first full pass.
        grow_after: Option<usize>,
    }

    impl<'a> Fake<'a> {
        fn new(budget: &'a Budget, sizes: Vec<usize>) -> Self {
            Self {
                sizes: Mutex::new(sizes),
                budget,
                asked: Mutex::new(Vec::new()),
                grow_after: None,
            }
        }

        fn fetch(&self, token: Option<String>, limit: u32) -> Result<Page, PageError> {
            let free = self.budget.available();
            self.asked
                .lock()
                .unwrap()
                .push((token.clone(), limit, free));
            let mut sizes = self.sizes.lock().unwrap();
            let start: usize = token.as_deref().map_or(0, |t| t.parse().unwrap());
            let end = (start + limit as usize).min(sizes.len());
            let bytes: usize = sizes[start..end].iter().map(|s| s + OVERHEAD).sum();
            if bytes > PAGE_BYTES {
                return Err(PageError::TooBig);
            }
            let objects = (start..end).map(|i| object(i, sizes[i])).collect();
            let next = (end < sizes.len()).then(|| end.to_string());
            if next.is_none()
                && let Some(more) = self.grow_after
            {
                sizes.iter_mut().for_each(|s| *s += more);
            }
            Ok(Page {
                objects,
                bytes,
                next,
            })
        }

        fn limits(&self) -> Vec<u32> {
            self.asked.lock().unwrap().iter().map(|a| a.1).collect()
        }

        fn least_free(&self) -> usize {
            self.asked
                .lock()
                .unwrap()
                .iter()
                .map(|a| a.2)
                .min()
                .unwrap()
        }
    }

    fn object(i: usize, size: usize) -> Object {
        let mut o = Object::new(RuleType::Configmap, "src", &format!("cm-{i}"));
        o.content = Some(Content {
            data: BTreeMap::from([("k".into(), "x".repeat(size - 1))]),
            ..Default::default()
        });
        o
    }

    macro_rules! fetcher {
        ($fake:expr) => {
            |token: Option<String>, limit: u32| {
                let fake = &$fake;
                async move { fake.fetch(token, limit) }
            }
        };
    }

    #[test]
    fn the_next_page_asks_for_what_fills_half_a_page() {
        assert_eq!(next_limit(0, 0), MAX_LIMIT);
        assert_eq!(next_limit(1000, 10), MAX_LIMIT, "small objects");
        assert_eq!(next_limit(4 * MIB, 4), 4, "1 MiB objects: 4 in half a page");
        assert_eq!(next_limit(7 * MIB, 1), 1, "never fewer than one");
        assert_eq!(smaller(100), Some(25));
        assert_eq!(smaller(3), Some(1));
        assert_eq!(smaller(1), None);
    }

    #[test]
    fn a_tally_is_over_only_past_its_limit() {
        let mut t = Tally::new(10);
        assert!(t.add(4));
        assert!(t.add(6), "exactly the limit is within it");
        assert!(!t.add(1));
        assert_eq!((t.bytes, t.objects), (11, 3));
        assert!(!Tally { bytes: 5, ..t }.add(usize::MAX), "saturates");
    }

    #[tokio::test]
    async fn sources_in_one_page_are_read_once_and_held_as_read() {
        let budget = Budget::new(64 * MIB);
        let fake = Fake::new(&budget, vec![1000; 3]);
        let sources = read_sources(&fetcher!(fake), &budget, 32 * MIB)
            .await
            .unwrap();
        assert_eq!(sources.objects.len(), 3);
        assert_eq!(fake.limits(), [FIRST_LIMIT]);
        assert_eq!(sources.hold.bytes(), 4 * 1024, "3,600 response bytes");
        assert_eq!(budget.available(), 64 * MIB - 4 * 1024);
        drop(sources);
        assert_eq!(budget.available(), 64 * MIB);
    }

    #[tokio::test]
    async fn sources_over_the_limit_are_never_held_together() {
        // The F4 case: 40 ConfigMaps of ~920 KB, a 32 MiB limit.
        let budget = Budget::new(64 * MIB);
        let fake = Fake::new(&budget, vec![920_000; 40]);
        let err = read_sources(&fetcher!(fake), &budget, 32 * MIB)
            .await
            .unwrap_err();
        let ReadError::Over(tally) = err else {
            panic!("{err}")
        };
        assert!(tally.bytes > 32 * MIB && tally.objects < 40, "{tally:?}");
        // Each request was made holding one page of the budget, nothing more.
        assert_eq!(fake.least_free(), 64 * MIB - PAGE_COST);
        assert_eq!(budget.available(), 64 * MIB, "everything given back");
        let asked = fake.asked.lock().unwrap();
        assert!(
            asked
                .last()
                .unwrap()
                .0
                .as_deref()
                .unwrap()
                .parse::<usize>()
                .unwrap()
                < 40,
            "stopped before the end: {asked:?}"
        );
    }

    #[tokio::test]
    async fn a_response_over_the_cap_is_asked_again_with_fewer_objects() {
        let budget = Budget::new(64 * MIB);
        let fake = Fake::new(&budget, vec![920_000; 12]);
        let sources = read_sources(&fetcher!(fake), &budget, 32 * MIB)
            .await
            .unwrap();
        assert_eq!(sources.objects.len(), 12);
        let limits = fake.limits();
        // 100 and 25 are over 8 MiB, 6 fits, then pages of 4 (half a page);
        // read again from 6.
        assert_eq!(limits, [100, 25, 6, 4, 4, 6, 4, 4]);
    }

    #[tokio::test]
    async fn sources_in_several_pages_are_measured_then_read_under_one_hold() {
        let budget = Budget::new(64 * MIB);
        let fake = Fake::new(&budget, vec![920_000; 12]);
        let sources = read_sources(&fetcher!(fake), &budget, 32 * MIB)
            .await
            .unwrap();
        let names: Vec<&str> = sources.objects.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names.len(), 12);
        assert_eq!(names[11], "cm-11");
        let raw = 12 * (920_000 + OVERHEAD);
        assert!(
            sources.hold.bytes() >= raw && sources.hold.bytes() <= raw + PAGE_BYTES,
            "{:?}",
            sources.hold
        );
        assert_eq!(budget.available(), 64 * MIB - sources.hold.bytes());
    }

    #[tokio::test]
    async fn sources_that_grow_between_the_passes_are_read_again_later() {
        let budget = Budget::new(64 * MIB);
        let mut fake = Fake::new(&budget, vec![920_000; 12]);
        fake.grow_after = Some(900_000);
        let err = read_sources(&fetcher!(fake), &budget, 32 * MIB)
            .await
            .unwrap_err();
        assert!(matches!(err, ReadError::Changed), "{err}");
        assert_eq!(budget.available(), 64 * MIB);
    }

    #[tokio::test]
    async fn sources_more_than_the_whole_budget_are_refused() {
        let budget = Budget::new(MIN_BUDGET);
        let fake = Fake::new(&budget, vec![920_000; 20]);
        let err = read_sources(&fetcher!(fake), &budget, 32 * MIB)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ReadError::Budget(BudgetError::Exceeds { .. })),
            "{err}"
        );
    }

    #[tokio::test]
    async fn one_object_over_a_page_is_an_error_not_a_loop() {
        let budget = Budget::new(64 * MIB);
        let fake = Fake::new(&budget, vec![PAGE_BYTES]);
        let err = read_sources(&fetcher!(fake), &budget, usize::MAX)
            .await
            .unwrap_err();
        assert!(matches!(err, ReadError::ObjectTooBig), "{err}");
        assert_eq!(fake.limits(), [100, 25, 6, 1]);
    }

    #[tokio::test]
    async fn copies_are_kept_as_fingerprints() {
        let budget = Budget::new(64 * MIB);
        let fake = Fake::new(&budget, vec![920_000; 12]);
        let copies = read_copies(&fetcher!(fake), &budget).await.unwrap();
        assert_eq!(copies.len(), 12);
        assert!(
            copies
                .iter()
                .all(|c| c.content.is_none() && c.fingerprint.is_some())
        );
        assert_eq!(fake.least_free(), 64 * MIB - PAGE_COST);
        assert_eq!(budget.available(), 64 * MIB);
    }

    const MIN_BUDGET: usize = super::super::budget::MIN_READ_BUDGET;
}
