//! One pass over a JSON document from the API server, before anything
//! decodes it: the `metadata.managedFields` of every object of a list or a
//! watch are cut out (of an object read alone, only when they are too
//! deep: they name who made an object the operator will not take over),
//! and an object nested deeper than [`MAX_DEPTH`] (or refused by a shape
//! check) is left out of a list, or turned into a bookmark in a watch.
//!
//! The pass copies the document's bytes and drops spans of them; it never
//! re-encodes a value, so what is kept reaches the decoder byte for byte.
//! It walks the document iteratively: its own depth is that of the three
//! levels it understands (a list, a watch event, an object's metadata),
//! whatever the depth of the values it skips. Anything that does not look
//! like JSON the API server writes makes it give up ([`Malformed`]) and
//! leave the document as it came.

use std::ops::Range;

/// The deepest an object may be nested, counted from the object itself
/// (`{"spec":{"a":[1]}}` is 3 deep), once its managedFields are cut out.
/// The decoder stops at 128 levels counted from the document, and a list
/// or a watch event adds up to two.
pub const MAX_DEPTH: usize = 100;

/// How a response body is laid out, from the request that asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One object (a get, the answer to a write).
    Object,
    /// A list: its `items` are objects.
    List,
    /// A watch: one event per line, each with an `object`.
    Events,
}

/// Why an object was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// Nested deeper than [`MAX_DEPTH`] (its depth, or the first depth
    /// found beyond the limit).
    TooDeep(usize),
    /// Its shape is not the one the operator reads (what the check said).
    WrongShape(String),
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooDeep(depth) => write!(
                f,
                "nested {depth} levels deep, more than the {MAX_DEPTH} the operator reads"
            ),
            Self::WrongShape(why) => write!(f, "not the shape the operator reads: {why}"),
        }
    }
}

/// Who an object left out is: its identifying fields as the document
/// wrote them (decoded strings; empty when absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

/// An object the pass left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Who it is.
    pub identity: Identity,
    /// Why.
    pub reason: SkipReason,
}

/// A check of one object's shape (its bytes, managedFields already cut
/// out): `Err` says why it cannot be read.
pub type ShapeCheck = dyn Fn(&[u8]) -> Result<(), String> + Send + Sync;

/// The document after the pass, with what it left out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    /// The bytes to decode.
    pub bytes: Vec<u8>,
    /// What was left out.
    pub skipped: Vec<Skipped>,
}

/// The document is not JSON as the API server writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// Cuts managedFields out of `doc`, a whole body of `shape` (for
/// [`Shape::Events`], one line), and leaves out the objects that are too
/// deep or that `check` refuses. A malformed document comes back as it
/// was, for the decoder to report.
pub fn scan(doc: &[u8], shape: Shape, check: Option<&ShapeCheck>) -> Scanned {
    let mut cur = Cursor { b: doc, i: 0 };
    let outcome = match shape {
        Shape::Object => object_document(&mut cur),
        Shape::List => list_document(&mut cur, check),
        Shape::Events => event_document(&mut cur, check),
    };
    match outcome {
        Ok(Outcome::Cut { cuts, skipped }) => Scanned {
            bytes: without(doc, &cuts),
            skipped,
        },
        Ok(Outcome::Replace { bytes, skipped }) => Scanned { bytes, skipped },
        Err(Malformed) => Scanned {
            bytes: doc.to_vec(),
            skipped: Vec::new(),
        },
    }
}

/// How deeply `doc` (one JSON value) is nested, found without recursion
/// (a scalar 0, `[]` 1, `[[1]]` 2), so that a caller can size the stack
/// of what will decode it.
pub fn depth(doc: &[u8]) -> Result<usize, Malformed> {
    let mut cur = Cursor { b: doc, i: 0 };
    let depth = cur.value()?;
    cur.whitespace();
    if cur.i == doc.len() {
        Ok(depth)
    } else {
        Err(Malformed)
    }
}

/// What a pass decided for a document.
enum Outcome {
    /// These spans go (sorted, disjoint).
    Cut {
        cuts: Vec<Range<usize>>,
        skipped: Vec<Skipped>,
    },
    /// The document is replaced.
    Replace {
        bytes: Vec<u8>,
        skipped: Vec<Skipped>,
    },
}

/// `doc` without the byte ranges `cuts` (sorted, disjoint).
fn without(doc: &[u8], cuts: &[Range<usize>]) -> Vec<u8> {
    let removed: usize = cuts.iter().map(|c| c.len()).sum();
    let mut out = Vec::with_capacity(doc.len() - removed);
    let mut at = 0;
    for cut in cuts {
        out.extend_from_slice(&doc[at..cut.start]);
        at = cut.end;
    }
    out.extend_from_slice(&doc[at..]);
    out
}

/// A position in a document.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Result<u8, Malformed> {
        self.b.get(self.i).copied().ok_or(Malformed)
    }

    fn whitespace(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), Malformed> {
        self.whitespace();
        if self.peek()? == byte {
            self.i += 1;
            Ok(())
        } else {
            Err(Malformed)
        }
    }

    /// Passes a string; its span, quotes included.
    fn string(&mut self) -> Result<Range<usize>, Malformed> {
        self.whitespace();
        let start = self.i;
        if self.peek()? != b'"' {
            return Err(Malformed);
        }
        self.i += 1;
        loop {
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Ok(start..self.i);
                }
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
    }

    /// Passes one value of any depth, without recursion; how deep it is
    /// (a scalar 0, `[]` 1, `[[1]]` 2).
    fn value(&mut self) -> Result<usize, Malformed> {
        let (mut depth, mut deepest) = (0usize, 0usize);
        loop {
            self.whitespace();
            match self.peek()? {
                b'{' | b'[' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                    self.i += 1;
                    continue;
                }
                b'}' | b']' => {
                    depth = depth.checked_sub(1).ok_or(Malformed)?;
                    self.i += 1;
                }
                b',' | b':' if depth > 0 => {
                    self.i += 1;
                    continue;
                }
                b'"' => {
                    self.string()?;
                }
                _ => self.scalar()?,
            }
            if depth == 0 {
                return Ok(deepest);
            }
        }
    }

    /// Passes a number, `true`, `false` or `null`.
    fn scalar(&mut self) -> Result<(), Malformed> {
        let start = self.i;
        while let Some(c) = self.b.get(self.i) {
            if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                break;
            }
            self.i += 1;
        }
        if self.i == start {
            Err(Malformed)
        } else {
            Ok(())
        }
    }

    /// Walks the members of the object starting here, calling `member`
    /// with each key (its span, quotes included) when the cursor is at
    /// its value; `member` must pass the value. Returns each member's
    /// span (key to value end) and the spans between members (commas),
    /// so one can be cut out cleanly.
    fn members(
        &mut self,
        mut member: impl FnMut(&mut Self, Range<usize>) -> Result<(), Malformed>,
    ) -> Result<Vec<Range<usize>>, Malformed> {
        self.expect(b'{')?;
        let mut spans = Vec::new();
        self.whitespace();
        if self.peek()? == b'}' {
            self.i += 1;
            return Ok(spans);
        }
        loop {
            let key = self.string()?;
            self.expect(b':')?;
            member(self, key.clone())?;
            spans.push(key.start..self.i);
            self.whitespace();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Ok(spans);
                }
                _ => return Err(Malformed),
            }
        }
    }

    /// Walks the elements of the array starting here; `element` must
    /// pass each one. Returns each element's span.
    fn elements(
        &mut self,
        mut element: impl FnMut(&mut Self) -> Result<(), Malformed>,
    ) -> Result<Vec<Range<usize>>, Malformed> {
        self.expect(b'[')?;
        let mut spans = Vec::new();
        self.whitespace();
        if self.peek()? == b']' {
            self.i += 1;
            return Ok(spans);
        }
        loop {
            self.whitespace();
            let start = self.i;
            element(self)?;
            spans.push(start..self.i);
            self.whitespace();
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Ok(spans);
                }
                _ => return Err(Malformed),
            }
        }
    }

    fn is_key(&self, key: &Range<usize>, name: &str) -> bool {
        self.b.get(key.start + 1..key.end - 1) == Some(name.as_bytes())
    }
}

/// The cuts that remove the elements of `spans` (all of one array) marked
/// in `left_out`, each run of neighbours with the commas around it.
fn runs_cut(spans: &[Range<usize>], left_out: &[bool]) -> Vec<Range<usize>> {
    let mut cuts = Vec::new();
    let mut k = 0;
    while k < spans.len() {
        if !left_out[k] {
            k += 1;
            continue;
        }
        let first = k;
        while k < spans.len() && left_out[k] {
            k += 1;
        }
        let last = k - 1;
        cuts.push(match (spans.get(k), first.checked_sub(1)) {
            (Some(next), _) => spans[first].start..next.start,
            (None, Some(previous)) => spans[previous].end..spans[last].end,
            (None, None) => spans[first].start..spans[last].end,
        });
    }
    cuts
}

/// The cut that removes the member or element `k` of `spans` (all of one
/// object or array) with the comma that separates it from a neighbour.
fn cut_of(spans: &[Range<usize>], k: usize) -> Range<usize> {
    match (
        spans.get(k + 1),
        k.checked_sub(1).and_then(|p| spans.get(p)),
    ) {
        (Some(next), _) => spans[k].start..next.start,
        (None, Some(previous)) => previous.end..spans[k].end,
        (None, None) => spans[k].clone(),
    }
}

/// What walking one object found.
struct Walked {
    /// Its span in the document.
    span: Range<usize>,
    /// Its depth, managedFields left out.
    depth: usize,
    /// The depth of its managedFields, counted from the object.
    managed_depth: usize,
    /// The cuts inside it (its managedFields).
    cuts: Vec<Range<usize>>,
    /// Spans of its identifying strings.
    identity: IdentitySpans,
}

#[derive(Default)]
struct IdentitySpans {
    api_version: Option<Range<usize>>,
    kind: Option<Range<usize>>,
    namespace: Option<Range<usize>>,
    name: Option<Range<usize>>,
    uid: Option<Range<usize>>,
    resource_version: Option<Range<usize>>,
}

impl IdentitySpans {
    fn decode(&self, b: &[u8]) -> Identity {
        let text = |span: &Option<Range<usize>>| {
            span.as_ref()
                .and_then(|s| serde_json::from_slice::<String>(&b[s.clone()]).ok())
                .unwrap_or_default()
        };
        Identity {
            api_version: text(&self.api_version),
            kind: text(&self.kind),
            namespace: text(&self.namespace),
            name: text(&self.name),
            uid: text(&self.uid),
            resource_version: text(&self.resource_version),
        }
    }
}

/// A string value's span, or `None` (and the value passed) for another type.
fn string_value(cur: &mut Cursor<'_>) -> Result<Option<Range<usize>>, Malformed> {
    cur.whitespace();
    if cur.peek()? == b'"' {
        cur.string().map(Some)
    } else {
        cur.value().map(|_| None)
    }
}

/// Nothing but whitespace may follow the document.
fn end(cur: &mut Cursor<'_>) -> Result<(), Malformed> {
    cur.whitespace();
    if cur.i == cur.b.len() {
        Ok(())
    } else {
        Err(Malformed)
    }
}

/// One object, at the top of the document: its managedFields cut out.
fn object_document(cur: &mut Cursor<'_>) -> Result<Outcome, Malformed> {
    let walked = object(cur)?;
    end(cur)?;
    // One object alone fails no list: its managedFields (which name who
    // made it, for an ownership conflict) stay unless they are too deep.
    let cuts = if walked.managed_depth > MAX_DEPTH {
        walked.cuts
    } else {
        Vec::new()
    };
    Ok(Outcome::Cut {
        cuts,
        skipped: Vec::new(),
    })
}

/// A list: every item walked; the items too deep or refused are cut out.
fn list_document(cur: &mut Cursor<'_>, check: Option<&ShapeCheck>) -> Result<Outcome, Malformed> {
    let mut cuts = Vec::new();
    let mut skipped = Vec::new();
    cur.members(|cur, key| {
        if !cur.is_key(&key, "items") {
            return cur.value().map(drop);
        }
        let mut items = Vec::new();
        let spans = cur.elements(|cur| {
            items.push(object(cur)?);
            Ok(())
        })?;
        let mut left_out = vec![false; items.len()];
        for (k, walked) in items.into_iter().enumerate() {
            match verdict(cur.b, &walked, check) {
                None => cuts.extend(walked.cuts),
                Some(reason) => {
                    left_out[k] = true;
                    skipped.push(Skipped {
                        identity: walked.identity.decode(cur.b),
                        reason,
                    });
                }
            }
        }
        cuts.extend(runs_cut(&spans, &left_out));
        Ok(())
    })?;
    end(cur)?;
    cuts.sort_by_key(|c| c.start);
    Ok(Outcome::Cut { cuts, skipped })
}

/// A watch event: its object walked; one too deep or refused becomes a
/// bookmark at its resourceVersion, so the watch goes on past it.
fn event_document(cur: &mut Cursor<'_>, check: Option<&ShapeCheck>) -> Result<Outcome, Malformed> {
    let mut object_found = None;
    let mut event_type = None;
    cur.members(|cur, key| {
        if cur.is_key(&key, "object") {
            object_found = Some(object(cur)?);
        } else if cur.is_key(&key, "type") {
            event_type = string_value(cur)?;
        } else {
            cur.value()?;
        }
        Ok(())
    })?;
    end(cur)?;
    let b = cur.b;
    let Some(walked) = object_found else {
        return Ok(Outcome::Cut {
            cuts: Vec::new(),
            skipped: Vec::new(),
        });
    };
    let of_type = |name: &str| {
        event_type
            .as_ref()
            .is_some_and(|t| b.get(t.start + 1..t.end - 1) == Some(name.as_bytes()))
    };
    // An error's object is a Status; a bookmark's has no body to check.
    let verdict = if of_type("ERROR") || of_type("BOOKMARK") {
        None
    } else {
        verdict(b, &walked, check)
    };
    match verdict {
        None => Ok(Outcome::Cut {
            cuts: walked.cuts,
            skipped: Vec::new(),
        }),
        Some(reason) => {
            let identity = walked.identity.decode(b);
            Ok(Outcome::Replace {
                bytes: bookmark(&identity),
                skipped: vec![Skipped { identity, reason }],
            })
        }
    }
}

/// Why the walked object is left out, if it is.
fn verdict(b: &[u8], walked: &Walked, check: Option<&ShapeCheck>) -> Option<SkipReason> {
    if walked.depth > MAX_DEPTH {
        return Some(SkipReason::TooDeep(walked.depth));
    }
    let check = check?;
    let offset = walked.span.start;
    let local: Vec<_> = walked
        .cuts
        .iter()
        .map(|c| c.start - offset..c.end - offset)
        .collect();
    let bytes = without(&b[walked.span.clone()], &local);
    check(&bytes).err().map(SkipReason::WrongShape)
}

/// Walks one object: its depth without managedFields, the cuts that
/// remove them, and its identity.
fn object(cur: &mut Cursor<'_>) -> Result<Walked, Malformed> {
    let mut depth = 1;
    let mut managed_depth = 0;
    let mut cuts = Vec::new();
    let mut identity = IdentitySpans::default();
    cur.whitespace();
    let start = cur.i;
    if cur.peek()? != b'{' {
        // Not an object (an item of another type): only its depth counts.
        let depth = cur.value()?;
        return Ok(Walked {
            span: start..cur.i,
            depth,
            managed_depth: 0,
            cuts,
            identity,
        });
    }
    cur.members(|cur, key| {
        if cur.is_key(&key, "metadata") {
            cur.whitespace();
            if cur.peek()? == b'{' {
                let (d, managed, cut) = metadata(cur, &mut identity)?;
                depth = depth.max(1 + d);
                managed_depth = 2 + managed;
                cuts.extend(cut);
                return Ok(());
            }
        } else if cur.is_key(&key, "apiVersion") {
            identity.api_version = string_value(cur)?;
            return Ok(());
        } else if cur.is_key(&key, "kind") {
            identity.kind = string_value(cur)?;
            return Ok(());
        }
        depth = depth.max(1 + cur.value()?);
        Ok(())
    })?;
    Ok(Walked {
        span: start..cur.i,
        depth,
        managed_depth,
        cuts,
        identity,
    })
}

/// Walks an object's `metadata`: its depth without managedFields, their
/// own depth, and the cut that removes them.
fn metadata(
    cur: &mut Cursor<'_>,
    identity: &mut IdentitySpans,
) -> Result<(usize, usize, Option<Range<usize>>), Malformed> {
    let mut depth = 1;
    let mut managed_depth = 0;
    let mut managed = None;
    let mut index = 0;
    let spans = cur.members(|cur, key| {
        let slot = if cur.is_key(&key, "managedFields") {
            managed = Some(index);
            index += 1;
            managed_depth = cur.value()?;
            return Ok(());
        } else if cur.is_key(&key, "name") {
            Some(&mut identity.name)
        } else if cur.is_key(&key, "namespace") {
            Some(&mut identity.namespace)
        } else if cur.is_key(&key, "uid") {
            Some(&mut identity.uid)
        } else if cur.is_key(&key, "resourceVersion") {
            Some(&mut identity.resource_version)
        } else {
            None
        };
        index += 1;
        match slot {
            Some(slot) => *slot = string_value(cur)?,
            None => depth = depth.max(1 + cur.value()?),
        }
        Ok(())
    })?;
    Ok((depth, managed_depth, managed.map(|k| cut_of(&spans, k))))
}

/// A BOOKMARK event at the resourceVersion of a skipped object.
fn bookmark(identity: &Identity) -> Vec<u8> {
    let event = serde_json::json!({
        "type": "BOOKMARK",
        "object": {
            "apiVersion": identity.api_version,
            "kind": identity.kind,
            "metadata": {"resourceVersion": identity.resource_version},
        },
    });
    event.to_string().into_bytes()
}

#[cfg(test)]
mod tests;
