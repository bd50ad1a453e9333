//! The lab's one HTTP client, for the feeder, the peers, the binary tests and
//! the benches: a [`ureq::Agent`] set up here once. Plain HTTP only (no TLS
//! stack is compiled), no proxy from the environment (the lab talks to
//! loopback), no transparent decompression (ureq's `gzip` feature stays off:
//! a test asking for gzip gets the bytes the server sent), and every status is an answer, not an error, so the
//! tests can check 4xx codes and their messages.
//!
//! The agent keeps connections alive and is shared by reference or by clone
//! across threads (clones share one pool).

use anyhow::{Context, Result};
use std::io::Read;
use std::time::Duration;
pub use ureq::http::HeaderMap;

/// A keep-alive HTTP client; cheap to clone (one shared connection pool).
#[derive(Clone, Debug)]
pub struct Client {
    agent: ureq::Agent,
}

/// A whole response: status, headers, and the body as sent (not decompressed).
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Response {
    /// A header's value, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as text, invalid UTF-8 replaced.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Client {
    /// A client whose calls fail after `timeout` (connect to last byte),
    /// keeping up to `connections` idle connections per host for reuse (the
    /// most requests a caller has in flight at once).
    pub fn new(timeout: Option<Duration>, connections: usize) -> Client {
        let connections = connections.max(1);
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(0)
            .timeout_global(timeout)
            .max_idle_connections(connections.max(10))
            .max_idle_connections_per_host(connections)
            .build();
        let agent = ureq::Agent::with_parts(
            config,
            ureq::unversioned::transport::DefaultConnector::default(),
            LiteralResolver::default(),
        );
        Client { agent }
    }

    /// The agent, for a request this module has no shortcut for.
    pub fn agent(&self) -> &ureq::Agent {
        &self.agent
    }

    /// `GET url` with extra headers.
    pub fn get(&self, url: &str, headers: &[(&str, &str)]) -> Result<Response> {
        let mut body = Vec::new();
        let (status, headers) = self.get_into(url, headers, &mut body)?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    /// `GET url`, its body read into `body` (cleared first), so a caller
    /// timing many requests reuses one buffer.
    pub fn get_into(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &mut Vec<u8>,
    ) -> Result<(u16, HeaderMap)> {
        let mut request = self.agent.get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        read_into(request.call(), "GET", url, body)
    }

    /// `POST url` with extra headers and `body` (`Content-Length` set).
    pub fn post(&self, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Response> {
        let mut request = self.agent.post(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        read(request.send(body), "POST", url)
    }

    /// `method url`: `GET` without a body, any other method with `body`.
    pub fn request(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response> {
        if method.eq_ignore_ascii_case("GET") {
            self.get(url, headers)
        } else {
            let mut request = ureq::http::Request::builder().method(method).uri(url);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let request = request
                .body(body)
                .with_context(|| format!("{method} {url}"))?;
            read(self.agent.run(request), method, url)
        }
    }
}

/// ureq's resolver, but an IP-literal host (the lab's loopback URLs) is its
/// own address: with a timeout set, ureq's resolver starts a thread per
/// request to resolve within it (even for `127.0.0.1`, even on a kept-alive
/// connection) — tens of µs a request, most of a loopback query's time.
#[derive(Debug, Default)]
struct LiteralResolver(ureq::unversioned::resolver::DefaultResolver);

impl ureq::unversioned::resolver::Resolver for LiteralResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> std::result::Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        let host = uri.host().unwrap_or("");
        // `[::1]` in a URL is `::1` as an address.
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        match (literal.parse::<std::net::IpAddr>(), uri.port_u16()) {
            (Ok(ip), Some(port)) if uri.scheme_str() == Some("http") => {
                let mut addrs = self.empty();
                addrs.push(std::net::SocketAddr::new(ip, port));
                Ok(addrs)
            }
            _ => self.0.resolve(uri, config, timeout),
        }
    }
}

/// The response of a call, its body read whole.
pub fn read(
    response: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    method: &str,
    url: &str,
) -> Result<Response> {
    let mut body = Vec::new();
    let (status, headers) = read_into(response, method, url, &mut body)?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn read_into(
    response: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    method: &str,
    url: &str,
    body: &mut Vec<u8>,
) -> Result<(u16, HeaderMap)> {
    let (head, mut reader) = response
        .with_context(|| format!("{method} {url}"))?
        .into_parts();
    body.clear();
    // No size limit: the lab's own servers and peers answer tens of megabytes.
    reader
        .as_reader()
        .read_to_end(body)
        .with_context(|| format!("{method} {url}: reading the body"))?;
    Ok((head.status.as_u16(), head.headers))
}
