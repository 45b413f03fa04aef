//! ExchangeRate (`operators.brennerm.github.io/v1`): a currency rate fetched
//! over HTTP into a ConfigMap owned by the resource, refreshed on a timer.
//!
//! Recipe: fetch the rate of `spec.currency` in `spec.base` from the provider
//! (only when a refresh is due, see below); put `rate`, `base`, `currency` and
//! `fetchedAt` into a kustomize `configMapGenerator` named after the resource
//! (kustomize adds its content-hash suffix) and apply it. The engine marks
//! the ConfigMap as the ExchangeRate's (and gives it an ownerReference), so
//! the older hashed ConfigMaps are pruned when a new one is applied and the
//! last one is deleted with the ExchangeRate.
//!
//! A refresh is due when nothing was fetched yet, the spec changed since the
//! last fetch (its generation, or the base the default resolves to), the
//! annotation [`REFRESH_ANNOTATION`] holds a value not seen yet, or
//! `fetchedAt + refreshInterval` (+ up to 10% jitter, at most 5 minutes) has
//! passed. Otherwise the values recorded in status are reused, so the overlay
//! and its digest stay the same and the engine spawns no kubectl: a
//! reconcile for a label or the resync fetches nothing. A
//! failed fetch keeps the last ConfigMap and is reported as `FetchFailed`.

mod flags;
mod kustomize_hash;
pub mod provider;

pub use flags::Flags;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{CustomResource, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::kind::{
    CommonStatus, ConfigMapGenerator, Handler, HandlerError, KindInfo, Labels, Overlay, Plan,
    PlannedEvent, Reason,
};
use crate::kinds::{KindContext, RustKind, namespaced_api};

pub use kustomize_hash::config_map_name;
use provider::Provider;

/// Setting this annotation to a new value forces a refresh.
pub const REFRESH_ANNOTATION: &str =
    "exchangerates.operators.brennerm.github.io/refresh-requested-at";
/// The label (value: the ExchangeRate's UID) that versions before the
/// ownership marker put on each of its ConfigMaps: such a ConfigMap is adopted.
pub const UID_LABEL: &str = "exchangerates.operators.brennerm.github.io/uid";
/// The label naming this operator as the manager.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The default provider: Frankfurter (European Central Bank rates, no API key).
pub const DEFAULT_URL: &str =
    "https://api.frankfurter.dev/v1/latest?base={base}&symbols={currency}";
/// Where the rate sits in the default provider's response.
pub const DEFAULT_RATE_PATH: &str = "rates.{currency}";
/// The base currency when `spec.base` is not set.
pub const DEFAULT_BASE: &str = "EUR";
/// The refresh interval when `spec.refreshInterval` is not set.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(3600);
/// The shortest refresh interval accepted by default.
pub const DEFAULT_MIN_REFRESH: Duration = Duration::from_secs(60);
/// The provider timeout by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound of the jitter added to each refresh.
const JITTER_MAX: Duration = Duration::from_secs(300);
/// ConfigMap names are at most 253 characters; kustomize adds 11.
const NAME_LIMIT: usize = 253 - 11;

/// Schema pattern of `spec.refreshInterval`: hours, minutes, seconds, in
/// that order, at least one (`1h`, `30m`, `1h30m`, `90s`).
const INTERVAL_PATTERN: &str =
    "^([0-9]{1,6}h([0-9]{1,6}m)?([0-9]{1,6}s)?|[0-9]{1,6}m([0-9]{1,6}s)?|[0-9]{1,6}s)$";
/// Schema pattern of a currency: an ISO 4217 code.
const CURRENCY_PATTERN: &str = "^[A-Z]{3}$";

/// An ExchangeRate asks for the rate of a currency in a ConfigMap.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "operators.brennerm.github.io",
    version = "v1",
    kind = "ExchangeRate",
    plural = "exchangerates",
    singular = "exchangerate",
    shortname = "er",
    namespaced,
    status = "ExchangeRateStatus",
    printcolumn = r#"{"name":"Currency","type":"string","jsonPath":".spec.currency"}"#,
    printcolumn = r#"{"name":"Rate","type":"string","jsonPath":".status.rate"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ExchangeRateSpec {
    /// The currency whose rate is fetched: an ISO 4217 code such as USD.
    #[schemars(pattern(CURRENCY_PATTERN))]
    pub currency: String,
    /// The base currency (ISO 4217); default: the operator's `--exchange-rate-base` (EUR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(CURRENCY_PATTERN))]
    pub base: Option<String>,
    /// How often the rate is fetched again, e.g. `30m`, `1h`, `1h30m` (default `1h`, at least `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(INTERVAL_PATTERN))]
    pub refresh_interval: Option<String>,
}

/// The status of an ExchangeRate: the shared fields plus the last fetch.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExchangeRateStatus {
    /// Conditions, last command, digest, inventory (shared by every kind).
    #[serde(flatten)]
    pub common: CommonStatus,
    /// The last fetch.
    #[serde(flatten)]
    pub rate: RateStatus,
}

/// The last good fetch, as recorded in status.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateStatus {
    /// The last rate fetched: units of `currency` for one unit of `base`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// The base currency of `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The currency of `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// When `rate` was fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub fetched_at: Option<jiff::Timestamp>,
    /// The ConfigMap holding `rate` (kustomize's hashed name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
    /// The generation of the spec `rate` was fetched for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_generation: Option<i64>,
    /// The refresh annotation's value when `rate` was fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_requested_at: Option<String>,
}

/// The operator's ExchangeRate settings (flags `--exchange-rate-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeRateOptions {
    /// Provider URL template with `{base}` and `{currency}`.
    pub url: String,
    /// Dotted path of the rate in the response; may use `{base}` and `{currency}`.
    pub rate_path: String,
    /// Base currency when `spec.base` is not set.
    pub base: String,
    /// Provider request timeout.
    pub timeout: Duration,
    /// Shortest `refreshInterval` accepted.
    pub min_refresh: Duration,
}

impl Default for ExchangeRateOptions {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.into(),
            rate_path: DEFAULT_RATE_PATH.into(),
            base: DEFAULT_BASE.into(),
            timeout: DEFAULT_TIMEOUT,
            min_refresh: DEFAULT_MIN_REFRESH,
        }
    }
}

/// True for an ISO 4217-shaped code (three ASCII capitals).
pub fn is_currency_code(s: &str) -> bool {
    s.len() == 3 && s.bytes().all(|b| b.is_ascii_uppercase())
}

/// One fetched rate: what the ConfigMap holds and when it was fetched for what.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    /// The rate, as a decimal string.
    pub rate: String,
    /// Base currency.
    pub base: String,
    /// Currency.
    pub currency: String,
    /// When.
    pub fetched_at: jiff::Timestamp,
    /// The resource generation it was fetched for.
    pub generation: Option<i64>,
    /// The refresh annotation's value at the time.
    pub refresh_requested_at: Option<String>,
}

impl Fetched {
    fn from_status(status: &RateStatus) -> Option<Self> {
        Some(Self {
            rate: status.rate.clone()?,
            base: status.base.clone()?,
            currency: status.currency.clone()?,
            fetched_at: status.fetched_at?,
            generation: status.fetched_generation,
            refresh_requested_at: status.refresh_requested_at.clone(),
        })
    }

    /// The ConfigMap data.
    pub fn data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("rate".to_string(), self.rate.clone()),
            ("base".to_string(), self.base.clone()),
            ("currency".to_string(), self.currency.clone()),
            ("fetchedAt".to_string(), self.fetched_at.to_string()),
        ])
    }

    /// The status recording this fetch, its ConfigMap named `config_map`.
    fn status(&self, config_map: String) -> RateStatus {
        RateStatus {
            rate: Some(self.rate.clone()),
            base: Some(self.base.clone()),
            currency: Some(self.currency.clone()),
            fetched_at: Some(self.fetched_at),
            config_map_name: Some(config_map),
            fetched_generation: self.generation,
            refresh_requested_at: self.refresh_requested_at.clone(),
        }
    }
}

/// Why a fetch was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// Nothing had been fetched yet.
    Initial,
    /// The spec changed since the last fetch.
    SpecChanged,
    /// The refresh annotation changed.
    Requested,
    /// The refresh interval passed.
    Interval,
}

impl Refresh {
    fn as_str(self) -> &'static str {
        match self {
            Self::Initial => "first fetch",
            Self::SpecChanged => "spec changed",
            Self::Requested => "refresh requested",
            Self::Interval => "refresh interval passed",
        }
    }
}

/// What [`ExchangeRateHandler::plan`] works from.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The rate to put in the ConfigMap.
    pub fetched: Fetched,
    /// Why it was fetched now, or `None` when reused from an earlier fetch.
    pub refresh: Option<Refresh>,
    /// The time of the observation (the timer is computed from it).
    pub now: jiff::Timestamp,
}

/// What the spec resolves to with the operator's defaults.
#[derive(Debug, Clone, PartialEq)]
struct Desired {
    currency: String,
    base: String,
    interval: Duration,
}

/// Fetches rates and builds ExchangeRate overlays.
#[derive(Debug)]
pub struct ExchangeRateHandler {
    info: KindInfo<()>,
    options: ExchangeRateOptions,
    provider: Provider,
}

impl RustKind for ExchangeRateHandler {
    type Flags = Flags;

    fn from_flags(flags: &Flags, _: &KindContext) -> Self {
        Self::new(flags.options())
    }
}

impl ExchangeRateHandler {
    /// The kind's short name.
    pub const NAME: &'static str = "exchangerate";

    /// A handler with these settings.
    pub fn new(options: ExchangeRateOptions) -> Self {
        let provider = Provider::new(&options.url, &options.rate_path, options.timeout);
        Self {
            info: KindInfo {
                owner_references: true,
                // The rate's ConfigMap is made for the resource's user.
                tenant_writes: true,
                ..KindInfo::new(
                    Self::NAME,
                    "operators.brennerm.github.io/kustomize-operator",
                    (),
                )
            },
            options,
            provider,
        }
    }

    fn desired(
        &self,
        er: &ExchangeRate,
        fallback_base: Option<&str>,
    ) -> Result<Desired, HandlerError> {
        let currency = er.spec.currency.clone();
        if !is_currency_code(&currency) {
            return Err(HandlerError::Invalid(format!(
                "currency {currency:?} is not an ISO 4217 code such as USD"
            )));
        }
        let base = er
            .spec
            .base
            .as_deref()
            .or(fallback_base)
            .unwrap_or(&self.options.base)
            .to_string();
        if !is_currency_code(&base) {
            return Err(HandlerError::Invalid(format!(
                "base {base:?} is not an ISO 4217 code such as EUR"
            )));
        }
        let interval = match er.spec.refresh_interval.as_deref() {
            None => DEFAULT_INTERVAL,
            Some(s) => crate::duration::parse_duration(s)
                .map_err(|e| HandlerError::Invalid(format!("refreshInterval: {e}")))?,
        };
        if interval < self.options.min_refresh {
            return Err(HandlerError::Invalid(format!(
                "refreshInterval {} is shorter than the minimum {:?}",
                er.spec.refresh_interval.as_deref().unwrap_or_default(),
                self.options.min_refresh
            )));
        }
        Ok(Desired {
            currency,
            base,
            interval,
        })
    }

    /// The overlay for an ExchangeRate and the values to put in its ConfigMap.
    pub fn overlay(er: &ExchangeRate, fetched: &Fetched) -> Result<Overlay, HandlerError> {
        let (name, namespace, _) = identity(er)?;
        Ok(Overlay {
            base: Some(Self::NAME.into()),
            namespace: Some(namespace),
            labels: vec![Labels {
                pairs: BTreeMap::from([(MANAGED_BY_LABEL.into(), "kustomize-operator".into())]),
                include_selectors: false,
                include_templates: false,
            }],
            config_map_generators: vec![ConfigMapGenerator {
                name,
                data: fetched.data(),
                ..Default::default()
            }],
            ..Default::default()
        })
    }
}

/// Name, namespace and UID, checked for what they become (a ConfigMap name,
/// a label value, a kubectl selector).
fn identity(er: &ExchangeRate) -> Result<(String, String, String), HandlerError> {
    let name = er.name_any();
    if name.len() > NAME_LIMIT {
        return Err(HandlerError::Invalid(format!(
            "ExchangeRate name is {} characters long; at most {NAME_LIMIT} leave room for the ConfigMap's hash suffix",
            name.len()
        )));
    }
    let namespace = er
        .namespace()
        .ok_or_else(|| HandlerError::Invalid("an ExchangeRate must have a namespace".into()))?;
    let uid = er.uid().ok_or_else(|| {
        HandlerError::Invalid(
            "metadata.uid is needed for the ConfigMap's ownerReference (render a resource read with `kubectl get -o yaml`)".into(),
        )
    })?;
    let uid_ok = !uid.is_empty()
        && uid.len() <= 63
        && uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !uid_ok {
        return Err(HandlerError::Invalid(format!(
            "metadata.uid {uid:?} is not a Kubernetes UID"
        )));
    }
    Ok((name, namespace, uid))
}

/// The annotation value asking for a refresh, if set.
fn refresh_requested(er: &ExchangeRate) -> Option<&str> {
    er.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(REFRESH_ANNOTATION))
        .map(String::as_str)
}

/// Up to 10% of the interval (at most [`JITTER_MAX`]), the same for the same
/// resource and fetch, so repeated reconciles agree on when the next one is due.
fn jitter(uid: &str, fetched_at: jiff::Timestamp, interval: Duration) -> Duration {
    let max = (interval / 10).min(JITTER_MAX);
    let digest = Sha256::new()
        .chain_update(uid.as_bytes())
        .chain_update([0])
        .chain_update(fetched_at.to_string().as_bytes())
        .finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    let fraction = u64::from_le_bytes(bytes) as f64 / u64::MAX as f64;
    max.mul_f64(fraction)
}

/// When the fetch `last` is due for a refresh; `None` when that is beyond
/// the times jiff represents (an interval of centuries).
fn next_due(uid: &str, last: &Fetched, interval: Duration) -> Option<jiff::Timestamp> {
    let wait = interval + jitter(uid, last.fetched_at, interval);
    let wait = jiff::SignedDuration::try_from(wait).ok()?;
    last.fetched_at.checked_add(wait).ok()
}

/// Why a fetch is due now, or `None` to reuse `last`.
fn refresh_due(
    er: &ExchangeRate,
    desired: &Desired,
    last: Option<&Fetched>,
    now: jiff::Timestamp,
) -> Option<Refresh> {
    let Some(last) = last else {
        return Some(Refresh::Initial);
    };
    if last.currency != desired.currency
        || last.base != desired.base
        || last.generation != er.meta().generation
    {
        return Some(Refresh::SpecChanged);
    }
    if let Some(requested) = refresh_requested(er)
        && last.refresh_requested_at.as_deref() != Some(requested)
    {
        return Some(Refresh::Requested);
    }
    match next_due(&er.uid().unwrap_or_default(), last, desired.interval) {
        Some(due) if due <= now => Some(Refresh::Interval),
        _ => None,
    }
}

/// The current time, to the millisecond (the precision kept in `fetchedAt`).
fn now_ms() -> jiff::Timestamp {
    let now = jiff::Timestamp::now();
    now.round(jiff::Unit::Millisecond).unwrap_or(now)
}

impl Handler for ExchangeRateHandler {
    type Resource = ExchangeRate;
    type Observed = Observed;
    type Status = RateStatus;

    fn info(&self) -> &KindInfo<()> {
        &self.info
    }

    fn api(&self, client: kube::Client, namespace: Option<&str>) -> kube::Api<ExchangeRate> {
        namespaced_api(client, namespace)
    }

    fn common_status(&self, er: &ExchangeRate) -> Option<CommonStatus> {
        er.status.as_ref().map(|s| s.common.clone())
    }

    async fn observe(&self, er: &ExchangeRate, _: &kube::Client) -> Result<Observed, HandlerError> {
        let desired = self.desired(er, None)?;
        identity(er)?;
        let last = er
            .status
            .as_ref()
            .and_then(|s| Fetched::from_status(&s.rate));
        let now = now_ms();
        let Some(refresh) = refresh_due(er, &desired, last.as_ref(), now) else {
            let fetched = last.ok_or_else(|| {
                HandlerError::transient(Reason::FetchFailed, "no rate fetched yet")
            })?;
            return Ok(Observed {
                fetched,
                refresh: None,
                now,
            });
        };
        // A first fetch has no last value to keep.
        let kept = if last.is_some() {
            "; keeping the last value"
        } else {
            ""
        };
        let rate = self
            .provider
            .fetch(&desired.base, &desired.currency)
            .await
            .map_err(|e| {
                HandlerError::transient(
                    Reason::FetchFailed,
                    format!(
                        "fetching the {}/{} rate ({}): {e}{kept}",
                        desired.base,
                        desired.currency,
                        refresh.as_str()
                    ),
                )
            })?;
        Ok(Observed {
            fetched: Fetched {
                rate,
                base: desired.base,
                currency: desired.currency,
                fetched_at: now,
                generation: er.meta().generation,
                refresh_requested_at: refresh_requested(er).map(str::to_string),
            },
            refresh: Some(refresh),
            now,
        })
    }

    /// `diff` and `render` never fetch: the values last fetched, from the
    /// resource's status.
    async fn observe_preview(
        &self,
        er: &ExchangeRate,
        _: &kube::Client,
    ) -> Result<Observed, HandlerError> {
        self.observe_offline(er, &[])
    }

    fn observe_offline(
        &self,
        er: &ExchangeRate,
        documents: &[serde_json::Value],
    ) -> Result<Observed, HandlerError> {
        let (rate, base, fetched_at) = offline_values(er, documents)?;
        provider::rate_at(&serde_json::Value::String(rate.clone()), "").map_err(|_| {
            HandlerError::Invalid(format!("rate {rate:?} is not a positive number"))
        })?;
        let desired = self.desired(er, base.as_deref())?;
        Ok(Observed {
            fetched: Fetched {
                rate,
                base: desired.base,
                currency: desired.currency,
                fetched_at,
                generation: er.meta().generation,
                refresh_requested_at: refresh_requested(er).map(str::to_string),
            },
            refresh: None,
            now: fetched_at,
        })
    }

    fn plan(
        &self,
        er: &ExchangeRate,
        observed: &Observed,
    ) -> Result<Plan<RateStatus>, HandlerError> {
        let desired = self.desired(er, Some(&observed.fetched.base))?;
        let (name, _, uid) = identity(er)?;
        let fetched = &observed.fetched;
        let config_map = config_map_name(&name, &fetched.data());
        let mut plan = Plan::apply(Self::overlay(er, fetched)?);
        plan.status = Some(fetched.status(config_map.clone()));
        // configMapName must name a ConfigMap that exists: on failure the
        // fields of the last success stay (no `failure_status`).
        if let Some(refresh) = observed.refresh {
            plan.events.push(PlannedEvent::normal(
                "Fetched",
                format!(
                    "1 {} = {} {} ({}); ConfigMap {config_map}",
                    fetched.base,
                    fetched.rate,
                    fetched.currency,
                    refresh.as_str()
                ),
            ));
        }
        let due = next_due(&uid, fetched, desired.interval);
        let wait = due
            .and_then(|due| observed.now.until(due).ok())
            .and_then(|span| {
                span.to_duration(jiff::SpanRelativeTo::days_are_24_hours())
                    .ok()
            })
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or(Duration::ZERO);
        plan.requeue_after = Some(wait.max(Duration::from_millis(100)));
        Ok(plan)
    }

    /// ConfigMaps made by versions before the ownership marker carry the
    /// ExchangeRate's UID in a label of their own: those are its own.
    fn adopts(&self, er: &ExchangeRate, live: &ObjectMeta) -> bool {
        let uid = er.uid();
        live.labels
            .as_ref()
            .and_then(|l| l.get(UID_LABEL))
            .is_some_and(|v| Some(v) == uid.as_ref())
    }
}

/// The rate, base and fetch time `render` uses: from a ConfigMap document
/// after the resource, or from the resource's status.
fn offline_values(
    er: &ExchangeRate,
    documents: &[serde_json::Value],
) -> Result<(String, Option<String>, jiff::Timestamp), HandlerError> {
    let from_document = documents.iter().find_map(|d| {
        let data = &d["data"];
        (d["kind"] == "ConfigMap" && data["rate"].is_string()).then(|| {
            (
                data["rate"].as_str().map(str::to_string),
                data["base"].as_str().map(str::to_string),
                data["fetchedAt"].as_str().map(str::to_string),
            )
        })
    });
    let status = er.status.clone().unwrap_or_default().rate;
    let (rate, base, fetched_at) = from_document.unwrap_or((
        status.rate.clone(),
        status.base.clone(),
        status.fetched_at.map(|t| t.to_string()),
    ));
    let (Some(rate), Some(fetched_at)) = (rate, fetched_at) else {
        return Err(HandlerError::Invalid(
            "render cannot fetch the rate: give it in the resource's status (rate, fetchedAt; as `kubectl get exchangerate NAME -o yaml` shows it) or in a ConfigMap document after the resource (data.rate, data.fetchedAt)".into(),
        ));
    };
    let fetched_at: jiff::Timestamp = fetched_at.parse().map_err(|e| {
        HandlerError::Invalid(format!(
            "fetchedAt {fetched_at:?} is not an RFC 3339 time: {e}"
        ))
    })?;
    Ok((rate, base, fetched_at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Step;
    use serde_json::json;

    const UID: &str = "6c0d1c38-3d4e-4a5b-9f00-0123456789ab";

    fn er(currency: &str) -> ExchangeRate {
        let mut er = ExchangeRate::new(
            "exchange-rate-usd",
            ExchangeRateSpec {
                currency: currency.into(),
                base: None,
                refresh_interval: None,
            },
        );
        er.metadata.namespace = Some("demo".into());
        er.metadata.uid = Some(UID.into());
        er.metadata.generation = Some(1);
        er
    }

    fn fetched(at: &str) -> Fetched {
        Fetched {
            rate: "1.1901".into(),
            base: "EUR".into(),
            currency: "USD".into(),
            fetched_at: at.parse().unwrap(),
            generation: Some(1),
            refresh_requested_at: None,
        }
    }

    fn handler() -> ExchangeRateHandler {
        ExchangeRateHandler::new(ExchangeRateOptions::default())
    }

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn plan_applies_a_generated_config_map_and_records_it() {
        let er = er("USD");
        let observed = Observed {
            fetched: fetched("2021-01-18T10:00:00Z"),
            refresh: Some(Refresh::Initial),
            now: ts("2021-01-18T10:00:00Z"),
        };
        let plan = handler().plan(&er, &observed).unwrap();
        let [
            Step::Apply {
                overlay,
                field_manager: None,
            },
        ] = plan.steps.as_slice()
        else {
            panic!("unexpected plan {plan:?}");
        };
        let generator = &overlay.config_map_generators[0];
        assert_eq!(generator.name, "exchange-rate-usd");
        assert_eq!(generator.data["rate"], "1.1901");
        assert_eq!(generator.data["fetchedAt"], "2021-01-18T10:00:00Z");
        assert_eq!(overlay.namespace.as_deref(), Some("demo"));
        assert!(
            overlay.patches.is_empty(),
            "the engine adds the ownerReference"
        );
        let status = plan.status.as_ref().unwrap();
        assert_eq!(
            status.config_map_name.as_deref(),
            Some("exchange-rate-usd-895mkt58mt")
        );
        assert_eq!(status.rate.as_deref(), Some("1.1901"));
        assert_eq!(status.fetched_generation, Some(1));
        assert_eq!(plan.failure_status, None);
        assert_eq!(plan.events[0].reason, "Fetched");
        let wait = plan.requeue_after.unwrap();
        assert!(
            wait >= DEFAULT_INTERVAL && wait <= DEFAULT_INTERVAL + JITTER_MAX,
            "{wait:?}"
        );
    }

    #[test]
    fn reused_values_give_the_same_plan_without_events() {
        let er = er("USD");
        let a = Observed {
            fetched: fetched("2021-01-18T10:00:00Z"),
            refresh: None,
            now: ts("2021-01-18T10:30:00Z"),
        };
        let plan = handler().plan(&er, &a).unwrap();
        assert!(plan.events.is_empty());
        let wait = plan.requeue_after.unwrap();
        assert!(wait >= Duration::from_secs(1800) && wait <= Duration::from_secs(1800 + 300));
        let b = Observed {
            now: ts("2021-01-18T10:45:00Z"),
            ..a
        };
        assert_eq!(handler().plan(&er, &b).unwrap().steps, plan.steps);
    }

    #[test]
    fn refresh_is_due_only_when_something_asks_for_it() {
        let mut er = er("USD");
        let d = handler().desired(&er, None).unwrap();
        let last = fetched("2021-01-18T10:00:00Z");
        let soon = ts("2021-01-18T10:59:00Z");
        assert_eq!(refresh_due(&er, &d, None, soon), Some(Refresh::Initial));
        assert_eq!(refresh_due(&er, &d, Some(&last), soon), None);
        // The interval (plus at most 10% jitter) passed.
        let late = ts("2021-01-18T11:06:00Z");
        assert_eq!(
            refresh_due(&er, &d, Some(&last), late),
            Some(Refresh::Interval)
        );
        // The annotation, once per value.
        er.metadata.annotations = Some(BTreeMap::from([(REFRESH_ANNOTATION.into(), "t1".into())]));
        assert_eq!(
            refresh_due(&er, &d, Some(&last), soon),
            Some(Refresh::Requested)
        );
        let seen = Fetched {
            refresh_requested_at: Some("t1".into()),
            ..last.clone()
        };
        assert_eq!(refresh_due(&er, &d, Some(&seen), soon), None);
        // A spec change.
        er.metadata.generation = Some(2);
        assert_eq!(
            refresh_due(&er, &d, Some(&seen), soon),
            Some(Refresh::SpecChanged)
        );
        // The default base changed (operator flag).
        er.metadata.generation = Some(1);
        let d_gbp = Desired {
            base: "GBP".into(),
            ..d
        };
        assert_eq!(
            refresh_due(&er, &d_gbp, Some(&seen), soon),
            Some(Refresh::SpecChanged)
        );
    }

    #[test]
    fn jitter_is_small_and_stable() {
        let i = Duration::from_secs(3600);
        let at = ts("2021-01-18T10:00:00Z");
        let a = jitter(UID, at, i);
        assert_eq!(a, jitter(UID, at, i));
        assert!(a <= Duration::from_secs(300));
        assert!(jitter(UID, at, Duration::from_secs(10)) <= Duration::from_secs(1));
        assert!(jitter(UID, at, Duration::from_secs(86400)) <= JITTER_MAX);
    }

    #[test]
    fn intervals_below_the_minimum_or_malformed_are_invalid() {
        let mut er = er("USD");
        er.spec.refresh_interval = Some("30s".into());
        let err = handler().desired(&er, None).unwrap_err();
        assert!(matches!(err, HandlerError::Invalid(_)));
        assert!(err.to_string().contains("minimum"), "{err}");
        er.spec.refresh_interval = Some("1x".into());
        assert!(matches!(
            handler().desired(&er, None),
            Err(HandlerError::Invalid(_))
        ));
        er.spec.refresh_interval = Some("90s".into());
        assert_eq!(
            handler().desired(&er, None).unwrap().interval,
            Duration::from_secs(90)
        );
        let lenient = ExchangeRateHandler::new(ExchangeRateOptions {
            min_refresh: Duration::from_secs(1),
            ..Default::default()
        });
        er.spec.refresh_interval = Some("2s".into());
        assert_eq!(
            lenient.desired(&er, None).unwrap().interval,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn bad_codes_and_names_are_invalid() {
        assert!(matches!(
            handler().desired(&er("usd"), None),
            Err(HandlerError::Invalid(_))
        ));
        assert!(matches!(
            handler().desired(&er("DOLLAR"), None),
            Err(HandlerError::Invalid(_))
        ));
        let mut long = er("USD");
        long.metadata.name = Some("a".repeat(243));
        assert!(matches!(identity(&long), Err(HandlerError::Invalid(_))));
        let mut no_uid = er("USD");
        no_uid.metadata.uid = None;
        assert!(matches!(identity(&no_uid), Err(HandlerError::Invalid(_))));
        let mut bad_uid = er("USD");
        bad_uid.metadata.uid = Some("x --all".into());
        assert!(matches!(identity(&bad_uid), Err(HandlerError::Invalid(_))));
    }

    #[test]
    fn offline_takes_the_rate_from_a_config_map_document_or_the_status() {
        let er_plain = er("USD");
        let err = handler().observe_offline(&er_plain, &[]).unwrap_err();
        assert!(err.to_string().contains("render cannot fetch"), "{err}");
        let doc = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"rate": "1.2", "base": "GBP", "fetchedAt": "2021-01-18T10:00:00Z"}});
        let o = handler().observe_offline(&er_plain, &[doc]).unwrap();
        assert_eq!(
            (o.fetched.rate.as_str(), o.fetched.base.as_str()),
            ("1.2", "GBP")
        );
        let mut with_status = er("USD");
        with_status.status = Some(ExchangeRateStatus {
            rate: RateStatus {
                rate: Some("1.3".into()),
                base: Some("EUR".into()),
                fetched_at: Some(ts("2021-01-18T10:00:00Z")),
                ..Default::default()
            },
            ..Default::default()
        });
        let o = handler().observe_offline(&with_status, &[]).unwrap();
        assert_eq!(o.fetched.rate, "1.3");
        let bad = json!({"kind": "ConfigMap", "data": {"rate": "abc", "fetchedAt": "2021-01-18T10:00:00Z"}});
        assert!(handler().observe_offline(&er_plain, &[bad]).is_err());
    }

    /// A provider on loopback answering `{"rates": {"USD": 1.25}}`; returns
    /// its URL template and a request counter.
    async fn loopback_provider() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let count = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        let app = axum::Router::new().route(
            "/{base}/{currency}",
            axum::routing::get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { r#"{"rates": {"USD": 1.25}}"# }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}/{{base}}/{{currency}}"), count)
    }

    #[tokio::test]
    async fn observe_fetches_when_due_and_reuses_the_status_otherwise() {
        use std::sync::atomic::Ordering;
        let (url, count) = loopback_provider().await;
        let h = ExchangeRateHandler::new(ExchangeRateOptions {
            url,
            ..Default::default()
        });
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let mut er = er("USD");
        let first = h.observe(&er, &client).await.unwrap();
        assert_eq!(first.refresh, Some(Refresh::Initial));
        assert_eq!(first.fetched.rate, "1.25");
        // What the engine writes after the apply: the next look reuses it.
        er.status = Some(ExchangeRateStatus {
            rate: first.fetched.status("cm".into()),
            ..Default::default()
        });
        let again = h.observe(&er, &client).await.unwrap();
        assert_eq!(again.refresh, None);
        assert_eq!(again.fetched, first.fetched);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn config_maps_of_earlier_versions_are_adopted_by_uid() {
        let h = handler();
        let er = er("USD");
        let meta = |uid: &str| ObjectMeta {
            labels: Some([(UID_LABEL.to_string(), uid.to_string())].into()),
            ..Default::default()
        };
        assert!(h.adopts(&er, &meta(UID)));
        assert!(!h.adopts(&er, &meta("another-uid")));
        assert!(!h.adopts(&er, &ObjectMeta::default()));
    }

    #[test]
    fn schema_has_the_patterns_and_names() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(ExchangeRate::crd()).unwrap();
        assert_eq!(
            crd["metadata"]["name"],
            "exchangerates.operators.brennerm.github.io"
        );
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["currency"]["pattern"], CURRENCY_PATTERN);
        assert_eq!(spec["properties"]["base"]["pattern"], CURRENCY_PATTERN);
        assert_eq!(
            spec["properties"]["refreshInterval"]["pattern"],
            INTERVAL_PATTERN
        );
        assert_eq!(spec["required"], json!(["currency"]));
        let columns: Vec<_> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(columns, ["Currency", "Rate", "Ready", "Age"]);
    }
}
