//! ClickHouse over HTTP, through the lab's one HTTP client: statements in the
//! body, inserts as `RowBinary` bodies (the statement in the `query`
//! parameter). An error answer keeps ClickHouse's own message (`Code: N, …`),
//! so a failed query says which shard or table it was.

use crate::http_client::Client;
use std::time::Duration;

/// One node's HTTP interface, e.g. `http://127.0.0.1:8123` (a query string,
/// such as `?user=U&password=P`, is kept and sent with every request).
#[derive(Clone, Debug)]
pub struct ClickHouse {
    /// Up to the `?` (no trailing `/`).
    base: String,
    /// The URL's own parameters, each followed by `&`.
    params: String,
    http: Client,
}

/// Why a statement failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No answer: the node is down, unreachable, or too slow.
    #[error("ClickHouse at {url}: {}", source.root_cause())]
    Transport { url: String, source: anyhow::Error },
    /// The node answered with an error.
    #[error("ClickHouse at {url} answered {status}: {message}")]
    Server {
        url: String,
        status: u16,
        /// ClickHouse's error code (`Code: N`), when the answer names one.
        code: Option<u32>,
        message: String,
    },
}

impl Error {
    /// ClickHouse's error code, if the node answered with one.
    pub fn code(&self) -> Option<u32> {
        match self {
            Error::Server { code, .. } => *code,
            Error::Transport { .. } => None,
        }
    }
}

impl ClickHouse {
    /// A client of the node at `url` whose requests fail after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let url = url.trim();
        if !url.starts_with("http://") {
            anyhow::bail!("ClickHouse URL {url:?}: expected http://HOST:PORT (its HTTP interface, e.g. http://127.0.0.1:8123)");
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut params = String::new();
        for p in query.split('&').filter(|p| !p.is_empty()) {
            params.push_str(p);
            params.push('&');
        }
        Ok(ClickHouse {
            base: base.trim_end_matches('/').to_string(),
            params,
            http: Client::new(Some(timeout), 4),
        })
    }

    /// The node's URL, without its parameters (which may hold a password).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Runs `sql` (any statement; `settings` as `name=value` parameters) and
    /// returns the answer's body.
    pub fn execute(&self, sql: &str, settings: &[(&str, &str)]) -> Result<Vec<u8>, Error> {
        let url = self.url_with(None, settings);
        self.post(&url, sql.as_bytes())
    }

    /// `INSERT INTO table (columns) FORMAT RowBinary` with `rows` as the body.
    pub fn insert(&self, table: &str, columns: &str, rows: &[u8]) -> Result<(), Error> {
        let statement = format!("INSERT INTO {table} ({columns}) FORMAT RowBinary");
        let url = self.url_with(Some(&statement), &[]);
        self.post(&url, rows).map(drop)
    }

    fn url_with(&self, query: Option<&str>, settings: &[(&str, &str)]) -> String {
        let mut url = format!("{}/?{}", self.base, self.params);
        if let Some(q) = query {
            url.push_str("query=");
            percent_encode(&mut url, q);
            url.push('&');
        }
        for (name, value) in settings {
            url.push_str(name);
            url.push('=');
            percent_encode(&mut url, value);
            url.push('&');
        }
        url.pop();
        url
    }

    /// One retry on a transport error: a kept-alive connection the node
    /// closed fails its next request (every statement here may be repeated:
    /// reads, `IF NOT EXISTS` DDL, and inserts whose rows replace themselves).
    fn post(&self, url: &str, body: &[u8]) -> Result<Vec<u8>, Error> {
        let response = match self.http.post(url, &[], body) {
            Ok(response) => response,
            // Not after a timeout: the node is there but slow (or stopped), and would be again.
            Err(e) if !is_timeout(&e) => {
                self.http
                    .post(url, &[], body)
                    .map_err(|source| Error::Transport {
                        url: self.base.clone(),
                        source,
                    })?
            }
            Err(source) => {
                return Err(Error::Transport {
                    url: self.base.clone(),
                    source,
                })
            }
        };
        if response.status == 200 {
            return Ok(response.body);
        }
        let message = response.text().trim().to_string();
        Err(Error::Server {
            url: self.base.clone(),
            status: response.status,
            code: error_code(&message),
            message,
        })
    }
}

fn is_timeout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<ureq::Error>(),
            Some(ureq::Error::Timeout(_))
        )
    })
}

/// `N` of ClickHouse's `Code: N, e.displayText() = …`.
fn error_code(message: &str) -> Option<u32> {
    let rest = message.strip_prefix("Code: ")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Appends `s` percent-encoded (everything but RFC 3986's unreserved bytes).
fn percent_encode(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// `s` as a ClickHouse string literal (quotes and backslashes escaped).
pub fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// Any bytes as a ClickHouse string literal: printable ASCII as it is
/// (quotes and backslashes escaped), every other byte `\xHH`.
pub fn literal_bytes(key: &[u8]) -> String {
    let mut out = String::from("'");
    for &b in key {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\'' => out.push_str("\\'"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02X}")),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_their_parameters_and_encode_ours() {
        let ch = ClickHouse::new(
            "http://127.0.0.1:8123/?user=u&password=p%20w",
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(ch.url(), "http://127.0.0.1:8123");
        assert_eq!(
            ch.url_with(Some("INSERT INTO t (a) FORMAT RowBinary"), &[("skip_unavailable_shards", "1")]),
            "http://127.0.0.1:8123/?user=u&password=p%20w&query=INSERT%20INTO%20t%20%28a%29%20FORMAT%20RowBinary&skip_unavailable_shards=1"
        );
        let bare = ClickHouse::new("http://h:1", Duration::from_secs(1)).unwrap();
        assert_eq!(bare.url_with(None, &[]), "http://h:1/");
        assert!(ClickHouse::new("https://h:1", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn error_codes_and_literals() {
        assert_eq!(
            error_code(
                "Code: 279, e.displayText() = DB::NetException: All connection tries failed"
            ),
            Some(279)
        );
        assert_eq!(error_code("Code: 60"), Some(60));
        assert_eq!(error_code("Code: x"), None);
        assert_eq!(error_code("oops"), None);
        assert_eq!(literal("a'b\\c"), "'a\\'b\\\\c'");
        assert_eq!(literal_bytes(b"\"a'b\\c\xff\n"), "'\"a\\'b\\\\c\\xFF\\x0A'");
    }
}
