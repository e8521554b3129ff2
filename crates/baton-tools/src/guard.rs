//! The outbound guard (DESIGN.md "Agents, tools, safety"): every request to a tenant-supplied
//! address (External tools, MCP servers, budget webhooks) goes through one client that
//!
//! - refuses IP literals in reserved ranges before sending (the `url` crate already turns
//!   `127.1`, `2130706433` and `0x7f000001` into `127.0.0.1`);
//! - resolves names itself and refuses a name if any of its addresses is reserved; the connection
//!   then goes to the addresses that were checked, so a second lookup (DNS rebinding) cannot
//!   swap them;
//! - re-checks every redirect and follows none to another origin (custom headers such as a
//!   caller's tool token would go along), uses no proxy, and reads bodies up to a cap.
//!
//! Relaxed only in a debug build with `BATON_DEV_ALLOW_PRIVATE_NETWORK=1`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use ipnet::{Ipv4Net, Ipv6Net};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

use crate::error::ToolError;

/// Redirects followed at most (each re-checked).
const MAX_REDIRECTS: usize = 5;

fn v4(text: &str) -> Option<Ipv4Net> {
    text.parse().ok()
}

fn v6(text: &str) -> Option<Ipv6Net> {
    text.parse().ok()
}

/// IPv4 ranges that are not the public internet (IANA special-purpose registry).
static FORBIDDEN_V4: LazyLock<Vec<Ipv4Net>> = LazyLock::new(|| {
    [
        "0.0.0.0/8",          // "this network", unspecified
        "10.0.0.0/8",         // private
        "100.64.0.0/10",      // carrier-grade NAT
        "127.0.0.0/8",        // loopback
        "169.254.0.0/16",     // link-local, cloud metadata
        "172.16.0.0/12",      // private
        "192.0.0.0/24",       // IETF protocol assignments
        "192.0.2.0/24",       // documentation
        "192.88.99.0/24",     // 6to4 relay anycast
        "192.168.0.0/16",     // private
        "198.18.0.0/15",      // benchmarking
        "198.51.100.0/24",    // documentation
        "203.0.113.0/24",     // documentation
        "224.0.0.0/4",        // multicast
        "240.0.0.0/4",        // reserved
        "255.255.255.255/32", // broadcast
    ]
    .iter()
    .filter_map(|n| v4(n))
    .collect()
});

/// The IPv6 internet: global unicast. Everything outside it is refused (loopback, unspecified,
/// IPv4-mapped, -compatible and -translated forms, NAT64, discard, SRv6 SIDs, unique and link
/// local, multicast, and whatever IANA reserves there later), so the list below only has to
/// name the special-purpose blocks inside it.
static GLOBAL_V6: LazyLock<Option<Ipv6Net>> = LazyLock::new(|| v6("2000::/3"));

/// Special-purpose blocks inside global unicast that are not the public internet, or that embed
/// an IPv4 address the guard could not see through (6to4, Teredo).
static FORBIDDEN_V6: LazyLock<Vec<Ipv6Net>> = LazyLock::new(|| {
    [
        "2001::/23",     // IETF protocol assignments: Teredo, benchmarking, ORCHID, AMT, ...
        "2001:db8::/32", // documentation
        "2002::/16",     // 6to4
        "3fff::/20",     // documentation
    ]
    .iter()
    .filter_map(|n| v6(n))
    .collect()
});

/// Whether an address is outside the public internet.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    FORBIDDEN_V4.iter().any(|net| net.contains(&ip))
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    let global = GLOBAL_V6.as_ref().is_some_and(|net| net.contains(&ip));
    !global || FORBIDDEN_V6.iter().any(|net| net.contains(&ip))
}

/// Whether private destinations are allowed: never in a release build.
#[derive(Debug, Clone, Default)]
pub struct GuardPolicy {
    allow_private: bool,
    /// Exact `ip:port` pairs let through (tests of the guard itself).
    allowed: Vec<SocketAddr>,
}

impl GuardPolicy {
    /// Refuses every reserved destination.
    pub fn strict() -> GuardPolicy {
        GuardPolicy::default()
    }

    /// Strict, unless this is a debug build run with `BATON_DEV_ALLOW_PRIVATE_NETWORK=1`.
    pub fn from_env() -> GuardPolicy {
        GuardPolicy::from_variable(
            std::env::var("BATON_DEV_ALLOW_PRIVATE_NETWORK")
                .ok()
                .as_deref(),
        )
    }

    /// [`GuardPolicy::from_env`] given the variable's value: relaxed by `"1"` only when debug
    /// assertions are compiled in, so a release build cannot be relaxed by its environment.
    fn from_variable(value: Option<&str>) -> GuardPolicy {
        let relaxed = cfg!(debug_assertions) && value == Some("1");
        if relaxed {
            tracing::warn!(
                "outbound guard relaxed: private addresses are reachable (development build)"
            );
        }
        GuardPolicy {
            allow_private: relaxed,
            allowed: Vec::new(),
        }
    }

    /// Lets one exact address through (a test server standing in for a public host).
    pub fn allowing(mut self, address: SocketAddr) -> GuardPolicy {
        self.allowed.push(address);
        self
    }

    pub fn allows_private(&self) -> bool {
        self.allow_private
    }

    /// Checks a URL before a request (and before each redirect): scheme, and IP literals.
    /// Names are checked when they are resolved.
    pub fn check_url(&self, url: &Url) -> Result<(), ToolError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ToolError::Forbidden {
                target: redact(url),
                reason: format!("scheme '{}' is not http or https", url.scheme()),
            });
        }
        let ip = match url.host() {
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
            Some(Host::Domain(_)) => return Ok(()),
            None => {
                return Err(ToolError::Forbidden {
                    target: redact(url),
                    reason: "the URL has no host".into(),
                });
            }
        };
        let port = url.port_or_known_default().unwrap_or(0);
        if self.allow_private
            || !is_forbidden(ip)
            || self.allowed.contains(&SocketAddr::new(ip, port))
        {
            Ok(())
        } else {
            Err(ToolError::Forbidden {
                target: redact(url),
                reason: format!("{ip} is a private or reserved address"),
            })
        }
    }
}

/// The URL without credentials, query or fragment, for messages and logs.
pub fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// Resolves with the system resolver, then refuses names with any reserved address.
struct GuardedResolver {
    policy: Arc<GuardPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port in.
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if addrs.is_empty() {
                return Err(format!("{host} has no address").into());
            }
            if !policy.allow_private
                && let Some(bad) = addrs.iter().find(|a| is_forbidden(a.ip()))
            {
                return Err(Box::new(ToolError::Forbidden {
                    target: host.clone(),
                    reason: format!(
                        "{host} resolves to {}, a private or reserved address",
                        bad.ip()
                    ),
                })
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// The one HTTP client for tenant-supplied destinations.
#[derive(Clone)]
pub struct GuardedClient {
    client: reqwest::Client,
    policy: Arc<GuardPolicy>,
}

impl GuardedClient {
    pub fn new(policy: GuardPolicy, connect_timeout: Duration) -> Result<GuardedClient, ToolError> {
        let policy = Arc::new(policy);
        let redirect_policy = policy.clone();
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(connect_timeout)
            .dns_resolver(GuardedResolver {
                policy: policy.clone(),
            })
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= MAX_REDIRECTS {
                    return attempt.error(ToolError::TooManyRedirects(MAX_REDIRECTS));
                }
                if let Err(err) = redirect_policy.check_url(attempt.url()) {
                    return attempt.error(err);
                }
                // Custom headers (a caller's tool token, stored API keys) would follow a redirect
                // to another origin: such a redirect is not followed (the 3xx is the answer).
                let same_origin = attempt
                    .previous()
                    .first()
                    .is_some_and(|first| first.origin() == attempt.url().origin());
                if same_origin {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }))
            .build()
            .map_err(|e| ToolError::Client(e.to_string()))?;
        Ok(GuardedClient { client, policy })
    }

    pub fn policy(&self) -> &GuardPolicy {
        &self.policy
    }

    /// The underlying client, for callers that need a `reqwest::Client` (the MCP transport).
    /// Its resolver and redirect policy guard every request; IP literals must still be checked
    /// with [`GuardPolicy::check_url`] first.
    pub fn inner(&self) -> &reqwest::Client {
        &self.client
    }

    /// Starts a request to `url` after checking it.
    pub fn request(
        &self,
        method: reqwest::Method,
        url: &Url,
    ) -> Result<reqwest::RequestBuilder, ToolError> {
        self.policy.check_url(url)?;
        Ok(self.client.request(method, url.clone()))
    }

    /// Sends a request built by [`GuardedClient::request`], classifying guard refusals.
    pub async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ToolError> {
        request.send().await.map_err(classify)
    }

    /// GETs `url` whole: its body up to `limit` bytes and its `content-type`, within
    /// `timeout`; an answer other than 2xx is an error naming its status.
    pub async fn fetch(
        &self,
        url: &Url,
        limit: usize,
        timeout: Duration,
    ) -> Result<Fetched, ToolError> {
        let request = self.request(reqwest::Method::GET, url)?;
        let fetched = async {
            let response = self.send(request).await?;
            if !response.status().is_success() {
                return Err(ToolError::Request(format!(
                    "answered {}",
                    response.status()
                )));
            }
            let content_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            let body = read_capped(response, limit).await?;
            Ok(Fetched { content_type, body })
        };
        tokio::time::timeout(timeout, fetched)
            .await
            .map_err(|_| ToolError::Timeout)?
    }
}

/// What [`GuardedClient::fetch`] read.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub content_type: Option<String>,
    pub body: Bytes,
}

/// A guard refusal inside reqwest's error chain becomes that refusal again.
fn classify(err: reqwest::Error) -> ToolError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(current) = source {
        if let Some(refused) = current.downcast_ref::<ToolError>() {
            return refused.clone();
        }
        source = current.source();
    }
    if err.is_timeout() {
        ToolError::Timeout
    } else {
        // Without the URL: it may hold a token in its query.
        ToolError::Request(err.without_url().to_string())
    }
}

/// Reads a body up to `limit` bytes; more is an error, and no more than `limit` (plus one
/// chunk) is ever held, whether or not the server sent a Content-Length.
pub async fn read_capped(response: reqwest::Response, limit: usize) -> Result<Bytes, ToolError> {
    if response
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(ToolError::TooLarge { limit });
    }
    let mut body = BytesMut::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(classify)?;
        if body.len() + chunk.len() > limit {
            return Err(ToolError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn reserved_addresses_in_every_spelling_are_refused() {
        let policy = GuardPolicy::strict();
        for url in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://0.0.0.0/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[fd00::1]/",
            "http://100.64.0.1/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://172.31.255.255/",
            "http://192.168.1.1/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://224.0.0.1/",
            "http://[fe80::1]/",
            "http://[2002:7f00:1::]/",
            "http://[::]/",
            // IPv4-translated (RFC 2765), the rest of ::/8, ORCHIDv2, documentation, SRv6.
            "http://[::ffff:0:a9fe:a9fe]/",
            "http://[::ffff:0:a00:1]/",
            "http://[::1:0:0:1]/",
            "http://[1::1]/",
            "http://[2001:20::1]/",
            "http://[2001:2::1]/",
            "http://[3fff::1]/",
            "http://[5f00::1]/",
            "http://[4000::1]/",
            "ftp://example.com/",
            "file:///etc/passwd",
        ] {
            let parsed = Url::parse(url).unwrap();
            assert!(
                matches!(policy.check_url(&parsed), Err(ToolError::Forbidden { .. })),
                "{url} was let through"
            );
        }
        for url in [
            "https://example.com/",
            "http://93.184.216.34/",
            "http://172.32.0.1/",
            "http://[2606:4700::1111]/",
            "http://[2001:4860:4860::8888]/",
            "http://[2a00:1450:4001::1]/",
        ] {
            assert!(policy.check_url(&Url::parse(url).unwrap()).is_ok(), "{url}");
        }
    }

    #[test]
    fn the_relaxation_is_off_unless_asked_for_in_a_debug_build() {
        assert!(!GuardPolicy::strict().allows_private());
        assert!(!GuardPolicy::from_variable(None).allows_private());
        assert!(!GuardPolicy::from_variable(Some("yes")).allows_private());
        // Asked for: on in a debug build, compiled out of any build without debug assertions
        // (`.ci/run` runs this test in such a build too).
        assert_eq!(
            GuardPolicy::from_variable(Some("1")).allows_private(),
            cfg!(debug_assertions)
        );
    }

    /// A TCP listener that counts connections and answers each with `response`.
    async fn server(response: String) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let response = response.clone();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    let _ = socket.read(&mut buffer).await;
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        (address, connections)
    }

    fn client(policy: GuardPolicy) -> GuardedClient {
        GuardedClient::new(policy, Duration::from_secs(2)).unwrap()
    }

    async fn get(client: &GuardedClient, url: &str) -> Result<reqwest::Response, ToolError> {
        let url = Url::parse(url).unwrap();
        let request = client.request(reqwest::Method::GET, &url)?;
        client.send(request).await
    }

    #[tokio::test]
    async fn a_loopback_canary_sees_no_connection() {
        let (canary, connections) =
            server("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()).await;
        let guarded = client(GuardPolicy::strict());
        let port = canary.port();
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://127.1:{port}/"),
            format!("http://2130706433:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            // A name that resolves to loopback is refused at resolution.
            format!("http://localhost:{port}/"),
        ] {
            let err = get(&guarded, &url).await.unwrap_err();
            assert!(matches!(err, ToolError::Forbidden { .. }), "{url}: {err:?}");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn redirects_to_private_addresses_are_refused() {
        let (canary, canary_connections) =
            server("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()).await;
        for location in [
            format!("http://127.0.0.1:{}/", canary.port()),
            format!("http://localhost:{}/", canary.port()),
            "http://169.254.169.254/latest/meta-data/".to_string(),
        ] {
            let (redirector, _) = server(format!(
                "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"
            ))
            .await;
            // The redirector stands in for a public host.
            let guarded = client(GuardPolicy::strict().allowing(redirector));
            // Refused outright (an IP literal), or not followed (another origin): either way the
            // answer is not the canary's.
            match get(&guarded, &format!("http://{redirector}/start")).await {
                Err(err) => assert!(
                    matches!(err, ToolError::Forbidden { .. }),
                    "{location}: {err:?}"
                ),
                Ok(response) => assert_eq!(response.status(), 302, "{location}"),
            }
        }
        assert_eq!(canary_connections.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn bodies_are_capped_with_and_without_content_length() {
        let big = "x".repeat(2048);
        let (with_length, _) = server(format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{big}",
            big.len()
        ))
        .await;
        let (chunked, _) = server(format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
            big.len()
        ))
        .await;
        let (small, _) = server("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".into()).await;
        let guarded = client(
            GuardPolicy::strict()
                .allowing(with_length)
                .allowing(chunked)
                .allowing(small),
        );
        for address in [with_length, chunked] {
            let response = get(&guarded, &format!("http://{address}/")).await.unwrap();
            let err = read_capped(response, 1024).await.unwrap_err();
            assert_eq!(err, ToolError::TooLarge { limit: 1024 }, "{address}");
        }
        let response = get(&guarded, &format!("http://{small}/")).await.unwrap();
        assert_eq!(read_capped(response, 1024).await.unwrap(), "hello");
    }
}
