//! Traces: the operator run with `--otlp-endpoint` exports its spans to a
//! real OpenTelemetry Collector (`hack/otelcol`: the collector's own
//! library, its OTLP receiver and debug exporter), started by the test on
//! loopback. A Sample's reconcile arrives as a `reconcile` span naming the
//! kind, the resource and its generation, and the `kubectl apply` it ran
//! as a `kubectl` span in the same trace.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ko_test_support as common;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

/// One span as the debug exporter prints it: its header fields (`Trace ID`,
/// `Parent ID`, `ID`, `Name`, ...) and its attributes (`kind` →
/// `Str(Sample)`).
#[derive(Debug, Default)]
struct Span {
    fields: BTreeMap<String, String>,
    attributes: BTreeMap<String, String>,
}

impl Span {
    fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }

    fn attribute(&self, name: &str) -> &str {
        self.attributes.get(name).map_or("", String::as_str)
    }
}

/// The spans in the collector's output, in the order printed.
fn spans(output: &str) -> Vec<Span> {
    let mut spans = Vec::new();
    let mut in_attributes = false;
    for line in output.lines() {
        let line = line.trim();
        if line.starts_with("Span #") {
            spans.push(Span::default());
            in_attributes = false;
            continue;
        }
        let Some(span) = spans.last_mut() else {
            continue;
        };
        if line.starts_with("Attributes:") {
            in_attributes = true;
        } else if let Some(attribute) = line.strip_prefix("-> ") {
            if let (true, Some((key, value))) = (in_attributes, attribute.split_once(": ")) {
                span.attributes.insert(key.into(), value.into());
            }
        } else if let Some((key, value)) = line.split_once(" : ") {
            span.fields.insert(key.trim().into(), value.trim().into());
            in_attributes = false;
        }
    }
    spans
}

/// The collector, receiving OTLP/HTTP on `port` and printing every span
/// in detail to `log`; killed when dropped.
struct Collector(std::process::Child);

impl Collector {
    fn start(binary: &Path, dir: &Path, port: u16) -> Self {
        let config = dir.join("collector.yaml");
        let text = format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
             exporters:\n  debug:\n    verbosity: detailed\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  \
             pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [debug]\n"
        );
        std::fs::write(&config, text).unwrap();
        let log = std::fs::File::create(dir.join("collector.log")).unwrap();
        let child = std::process::Command::new(binary)
            .arg(format!("--config=file:{}", config.display()))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the collector");
        Self(child)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_reconcile_and_its_kubectl_run_reach_the_collector_as_one_trace() {
    let Some(otelcol) = common::otelcol_path() else {
        return;
    };
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "traced").await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let _collector = Collector::start(&otelcol, dir.path(), port);
    let log = dir.path().join("collector.log");
    common::wait_for(TIMEOUT, "the collector receiving", async || {
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        if output.contains("Everything is ready") {
            Ok(())
        } else {
            Err(output)
        }
    })
    .await;

    let endpoint = format!("http://127.0.0.1:{port}");
    let operator = common::OperatorProcess::spawn(
        &ns.name,
        &[],
        &["--kinds", "sample", "--otlp-endpoint", &endpoint],
    );
    let sample = json!({
        "apiVersion": "nuvolaris.org/v1", "kind": "Sample",
        "metadata": {"name": "traced", "namespace": ns.name},
        "spec": {"count": 1},
    });
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &sample.to_string());
    assert!(ok, "apply the Sample: {err}");

    let object = format!("{}/traced", ns.name);
    let (reconcile, kubectl) = common::wait_for(TIMEOUT, "the reconcile's spans", async || {
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        let spans = spans(&output);
        let reconcile = spans
            .iter()
            .find(|s| {
                s.field("Name") == "reconcile" && s.attribute("object") == format!("Str({object})")
            })
            .ok_or_else(|| {
                format!(
                    "no reconcile span of {object}; operator: {}",
                    operator.log_tail()
                )
            })?;
        let kubectl = spans
            .iter()
            .find(|s| {
                s.field("Name") == "kubectl"
                    && s.attribute("verb") == "Str(apply)"
                    && s.field("Trace ID") == reconcile.field("Trace ID")
            })
            .ok_or("no kubectl apply in its trace")?;
        Ok::<_, String>((
            (reconcile.fields.clone(), reconcile.attributes.clone()),
            (kubectl.fields.clone(), kubectl.attributes.clone()),
        ))
    })
    .await;

    assert_eq!(
        reconcile.1.get("kind").map(String::as_str),
        Some("Str(Sample)")
    );
    assert_eq!(
        reconcile.1.get("generation").map(String::as_str),
        Some("Int(1)")
    );
    assert_ne!(
        kubectl.0.get("Parent ID").map(String::as_str),
        Some(""),
        "inside a span"
    );
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        output.contains("service.name: Str(kustomize-operator)"),
        "the spans name the service"
    );
}
