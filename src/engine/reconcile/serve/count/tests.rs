use std::convert::Infallible;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{Request, Response};
use http_body_util::StreamBody;
use hyper::body::Frame;
use kube::api::{ApiResource, GroupVersionKind};
use serde_json::json;

use super::*;

fn greeting() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("g.test", "v1", "Greeting"),
        "greetings",
    )
}

fn listed(uids: &[&str], version: &str, next: Option<&str>) -> String {
    let items: Vec<_> = (uids.iter())
        .map(|uid| json!({"metadata": {"name": uid, "namespace": "a", "uid": uid}}))
        .collect();
    let metadata = json!({"resourceVersion": version, "continue": next.unwrap_or_default()});
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": metadata, "items": items}).to_string()
}

fn line(event: &str, uid: &str, version: &str) -> String {
    let object = json!({"metadata": {"name": uid, "uid": uid, "resourceVersion": version}});
    format!("{}\n", json!({"type": event, "object": object}))
}

fn expired() -> String {
    let object = json!({"kind": "Status", "code": 410, "message": "too old resource version"});
    format!("{}\n", json!({"type": "ERROR", "object": object}))
}

/// A mocked API server answering the count's requests from a script: the
/// list's pages in turn, and each watch's lines (the last watch stays
/// open, bringing nothing); every request's query is kept.
struct Script {
    pages: Vec<String>,
    watches: Vec<String>,
    asked: Vec<String>,
}

fn client(script: Arc<Mutex<Script>>) -> kube::Client {
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        let script = script.clone();
        async move {
            let mut script = script.lock().unwrap();
            let query = request.uri().query().unwrap_or_default().to_string();
            script.asked.push(query.clone());
            let frames: Frames = if !query.contains("watch=true") {
                let page = Bytes::from(script.pages.remove(0));
                futures::stream::iter([Ok(Frame::data(page))]).boxed()
            } else if script.watches.is_empty() {
                futures::stream::pending().boxed()
            } else {
                let lines = Bytes::from(script.watches.remove(0));
                futures::stream::iter([Ok(Frame::data(lines))]).boxed()
            };
            Ok::<_, Infallible>(Response::new(StreamBody::new(frames)))
        }
    });
    kube::Client::new(service, "default")
}

/// A response's body, frame by frame.
type Frames = futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>;

/// Runs the count over `script` until `until` holds of the count and
/// what the server was asked, or fails after 10 s.
async fn counted_until(
    script: &Arc<Mutex<Script>>,
    until: impl Fn(Option<u64>, &[String]) -> bool,
) -> (Option<u64>, usize) {
    let count = Arc::new(Count::default());
    let changes = Arc::new(AtomicUsize::new(0));
    let told = changes.clone();
    let counted = Counted {
        resource: greeting(),
        on_count: Arc::new(move || {
            told.fetch_add(1, Ordering::Relaxed);
        }),
        by_resource_watch: false,
    };
    let stop = CancellationToken::new();
    let counting = tokio::spawn(super::count(
        client(script.clone()),
        counted,
        count.clone(),
        stop.clone(),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let done = until(count.get(), &script.lock().unwrap().asked);
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the count stayed at {:?}",
            count.get()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.cancel();
    counting.await.unwrap();
    (count.get(), changes.load(Ordering::Relaxed))
}

#[tokio::test]
async fn the_count_lists_every_page_then_follows_additions_and_deletions_from_the_list_version() {
    let script = Arc::new(Mutex::new(Script {
        pages: vec![
            listed(&["a", "b"], "10", Some("next")),
            listed(&["c"], "10", None),
        ],
        watches: vec![
            line("ADDED", "d", "11")
                + &line("MODIFIED", "a", "12")
                + &line("DELETED", "b", "13")
                + &line("BOOKMARK", "", "14"),
        ],
        asked: Vec::new(),
    }));
    let (count, changes) = counted_until(&script, |_, asked| asked.len() == 4).await;
    assert_eq!(count, Some(3), "a, c and d");
    assert_eq!(changes, 3, "3 listed, 4 added, 3 deleted");
    let asked = script.lock().unwrap().asked.clone();
    assert!(asked[0].contains("limit=500"), "{asked:?}");
    assert!(asked[1].contains("continue=next"), "{asked:?}");
    assert!(
        asked[2].contains("watch=true") && asked[2].contains("resourceVersion=10"),
        "{asked:?}"
    );
    assert!(
        asked[3].contains("resourceVersion=14"),
        "the next watch from the bookmark: {asked:?}"
    );
}

#[tokio::test]
async fn an_expired_version_lists_again_at_once_and_the_count_follows_the_new_list() {
    let script = Arc::new(Mutex::new(Script {
        pages: vec![listed(&["a", "b"], "10", None), listed(&["a"], "20", None)],
        watches: vec![expired()],
        asked: Vec::new(),
    }));
    let (count, changes) = counted_until(&script, |_, asked| asked.len() == 4).await;
    assert_eq!(count, Some(1));
    assert_eq!(changes, 2, "2 listed, then 1");
    let asked = script.lock().unwrap().asked.clone();
    assert!(asked[3].contains("resourceVersion=20"), "{asked:?}");
}

#[test]
fn a_line_cut_short_ends_the_watch_and_a_failure_says_why() {
    let mut version = String::from("1");
    let mut uids = HashSet::new();
    assert!(seen(line("ADDED", "a", "2").as_bytes(), &mut version, &mut uids).unwrap());
    assert!(
        !seen(
            line("MODIFIED", "a", "3").as_bytes(),
            &mut version,
            &mut uids
        )
        .unwrap()
    );
    assert_eq!(version, "3");
    let failed = json!({"type": "ERROR", "object": {"code": 500, "message": "etcd is away"}});
    let error = seen(failed.to_string().as_bytes(), &mut version, &mut uids).unwrap_err();
    assert_eq!(error.to_string(), "the watch failed: etcd is away");
    assert!(matches!(
        seen(expired().as_bytes(), &mut version, &mut uids),
        Err(CountError::Expired)
    ));

    let cut = futures::io::Cursor::new(b"{\"type\":\"ADDED\"}\n{\"type\"".to_vec());
    let mut cut = futures::io::BufReader::new(cut);
    let first = futures::executor::block_on(next_line(&mut cut)).unwrap();
    assert!(first.is_some());
    assert!(
        futures::executor::block_on(next_line(&mut cut))
            .unwrap()
            .is_none()
    );
}
