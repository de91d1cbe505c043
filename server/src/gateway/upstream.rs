//! One pooled HTTP/1.1 keep-alive client per upstream graph, with connect and first-byte
//! timeouts (no total timeout: a stream may legitimately run for minutes).

use std::time::Duration;

use super::request::Endpoint;

/// Timeouts and pool sizes shared by every upstream client.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub pool_idle_per_host: usize,
}

impl From<&crate::cli::GatewayArgs> for UpstreamOptions {
    fn from(a: &crate::cli::GatewayArgs) -> Self {
        Self {
            connect_timeout: Duration::from_millis(a.upstream_connect_timeout_ms),
            first_byte_timeout: Duration::from_millis(a.upstream_first_byte_timeout_ms),
            pool_idle_per_host: a.upstream_pool_idle,
        }
    }
}

/// An upstream's base URL (ending in `/v1`) and its client.
#[derive(Debug)]
pub struct Upstream {
    pub base_url: String,
    pub client: reqwest::Client,
    pub first_byte_timeout: Duration,
    /// Parsed once, not per request.
    chat_url: reqwest::Url,
    completions_url: reqwest::Url,
}

impl Upstream {
    pub fn new(base_url: &str, options: &UpstreamOptions) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .http1_only()
            .connect_timeout(options.connect_timeout)
            .pool_max_idle_per_host(options.pool_idle_per_host)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .no_proxy()
            .build()?;
        let base_url = base_url.trim_end_matches('/').to_owned();
        let parse = |path: &str| {
            reqwest::Url::parse(&format!("{base_url}{path}"))
                .map_err(|e| anyhow::anyhow!("upstream URL {base_url:?} is invalid: {e}"))
        };
        Ok(Self {
            chat_url: parse(Endpoint::Chat.path())?,
            completions_url: parse(Endpoint::Completions.path())?,
            base_url,
            client,
            first_byte_timeout: options.first_byte_timeout,
        })
    }

    /// The endpoint's URL on this upstream.
    pub fn url(&self, endpoint: Endpoint) -> reqwest::Url {
        match endpoint {
            Endpoint::Chat => self.chat_url.clone(),
            Endpoint::Completions => self.completions_url.clone(),
        }
    }
}
