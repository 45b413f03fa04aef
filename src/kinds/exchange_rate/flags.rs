//! ExchangeRate's command-line flags (`run` and `render` share them).

use std::time::Duration;

use clap::Args;

use super::{DEFAULT_BASE, DEFAULT_RATE_PATH, DEFAULT_URL, ExchangeRateOptions, is_currency_code};
use crate::duration::parse_duration;

/// ExchangeRate flags: the rate provider and the refresh limits.
#[derive(Debug, Clone, PartialEq, Args)]
#[group(id = "exchange_rate_flags")]
pub struct Flags {
    /// ExchangeRate: provider URL; `{base}` and `{currency}` are replaced by the ISO 4217 codes.
    #[arg(long = "exchange-rate-url", env = "EXCHANGE_RATE_URL", default_value = DEFAULT_URL, value_parser = parse_url_template)]
    pub url: String,
    /// ExchangeRate: where the rate sits in the provider's JSON answer (dotted path; `{base}`, `{currency}` replaced).
    #[arg(long = "exchange-rate-path", env = "EXCHANGE_RATE_PATH", default_value = DEFAULT_RATE_PATH)]
    pub rate_path: String,
    /// ExchangeRate: the base currency when `spec.base` is not set.
    #[arg(long = "exchange-rate-base", env = "EXCHANGE_RATE_BASE", default_value = DEFAULT_BASE, value_parser = parse_currency)]
    pub base: String,
    /// ExchangeRate: provider requests taking longer fail.
    #[arg(long = "exchange-rate-timeout", env = "EXCHANGE_RATE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// ExchangeRate: the shortest `spec.refreshInterval` accepted (shorter is InvalidSpec).
    #[arg(long = "exchange-rate-min-refresh", env = "EXCHANGE_RATE_MIN_REFRESH", default_value = "1m", value_parser = parse_duration)]
    pub min_refresh: Duration,
}

impl Default for Flags {
    /// What the flags' defaults parse to.
    fn default() -> Self {
        let ExchangeRateOptions {
            url,
            rate_path,
            base,
            timeout,
            min_refresh,
        } = ExchangeRateOptions::default();
        Self {
            url,
            rate_path,
            base,
            timeout,
            min_refresh,
        }
    }
}

impl Flags {
    /// The handler's settings.
    pub fn options(&self) -> ExchangeRateOptions {
        ExchangeRateOptions {
            url: self.url.clone(),
            rate_path: self.rate_path.clone(),
            base: self.base.clone(),
            timeout: self.timeout,
            min_refresh: self.min_refresh,
        }
    }
}

fn parse_url_template(s: &str) -> Result<String, String> {
    super::provider::check_url_template(s).map(|()| s.to_string())
}

fn parse_currency(s: &str) -> Result<String, String> {
    if is_currency_code(s) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not an ISO 4217 code such as EUR"))
    }
}
