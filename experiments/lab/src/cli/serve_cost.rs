//! `promlab serve-cost`: what a store scrape costs over HTTP against what
//! the same export costs in process, side by side in one run.
//!
//! One process, one store, the same strategies. Arms, interleaved round by
//! round, each a median over every sample:
//! - `export`: a long-lived exporter's `export_into` a reused buffer, in process;
//! - `export_gzip`: that, then gzip level 1 of it, in process (a scrape that
//!   compressed every time would cost this);
//! - `http_floor`: `GET /-/healthy` on a keep-alive loopback connection (the
//!   HTTP round trip with no work behind it);
//! - `http`: `GET /metrics` on that connection, the whole body read;
//! - `http_gzip`: the same with `Accept-Encoding: gzip`, as Prometheus asks;
//! - `tcp_floor`: the same answer (head and plain body, made once) written
//!   whole by a plain thread to its own keep-alive loopback connection for
//!   each request, read by the same client: what moving these bytes over
//!   loopback costs with no HTTP server and no export behind it (the floor of
//!   `http`: `http` can cost no less than `export` plus this).
//!
//! The server is `serve --store`'s own router on its own runtime, in a thread
//! of this process, with an exporter of its own. Every timed response is
//! checked after its timing: the plain body is the in-process export's bytes,
//! the gzip body decompresses to them.

use crate::servers::metrics::{app, Source};
use anyhow::{bail, Context, Result};
use promlab::export::Exporter;
use promlab::format::registry::Registry;
use promlab::shared::strategy::StrategySet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `promlab serve-cost`.
#[derive(clap::Args, Debug)]
pub struct ServeCostArgs {
    /// Store directory (client_ruby DirectFileStore layout).
    #[arg(long)]
    pub store: PathBuf,
    /// The registry (registry.json format).
    #[arg(long)]
    pub registry: PathBuf,
    /// Strategies of both the in-process exporter and the server's.
    #[arg(long, default_value = "default")]
    pub strategies: StrategySet,
    /// Rounds; each runs every arm `--per-round` times, in turn.
    #[arg(long, default_value_t = 30)]
    pub rounds: usize,
    #[arg(long, default_value_t = 20)]
    pub per_round: usize,
    /// Run directory to write `serve-cost.csv` and `machine.txt` into.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

const ARMS: [(&str, &str); 6] = [
    ("export", "in process: export_into a reused buffer"),
    (
        "export_gzip",
        "in process: export_into, then gzip level 1 of it",
    ),
    ("http_floor", "GET /-/healthy over keep-alive loopback"),
    (
        "http",
        "GET /metrics over keep-alive loopback, body read whole",
    ),
    (
        "http_gzip",
        "GET /metrics, Accept-Encoding: gzip, body read whole",
    ),
    (
        "tcp_floor",
        "the plain answer, made once, written whole by a thread per request over keep-alive loopback",
    ),
];

pub fn serve_cost(args: ServeCostArgs) -> Result<()> {
    let registry = Registry::load(&args.registry)?;
    let mut exporter = Exporter::new(&args.store, registry.clone(), args.strategies);
    let server_exporter = Exporter::new(&args.store, registry, args.strategies);
    let addr = start_server(server_exporter)?;
    let mut client = Connection::open(addr)?;

    let mut want = Vec::new();
    exporter.export_into(&mut want)?;
    let mut floor_client = Connection::open(start_floor_server(&want)?)?;
    let mut out = Vec::new();
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); ARMS.len()];
    let gzip_header = [("Accept-Encoding", "gzip")];
    let identity = [("Accept-Encoding", "identity")];
    // One warm-up round, not kept.
    for round in 0..=args.rounds {
        for (arm, kept) in samples.iter_mut().enumerate() {
            for _ in 0..args.per_round {
                let took = match arm {
                    0 => {
                        let started = Instant::now();
                        exporter.export_into(&mut out)?;
                        let took = started.elapsed();
                        check(&out, &want, "export")?;
                        took
                    }
                    1 => {
                        let started = Instant::now();
                        exporter.export_into(&mut out)?;
                        let gzipped = gzip(&out)?;
                        let took = started.elapsed();
                        check(&gunzip(&gzipped)?, &want, "export_gzip")?;
                        took
                    }
                    2 => {
                        let started = Instant::now();
                        client.get("/-/healthy", &identity)?;
                        let took = started.elapsed();
                        check(client.body(), b"promlab is Healthy.\n", "http_floor")?;
                        took
                    }
                    3 => {
                        let started = Instant::now();
                        client.get("/metrics", &identity)?;
                        let took = started.elapsed();
                        if client.gzipped {
                            bail!("http: a gzip body was not asked for");
                        }
                        check(client.body(), &want, "http")?;
                        took
                    }
                    4 => {
                        let started = Instant::now();
                        client.get("/metrics", &gzip_header)?;
                        let took = started.elapsed();
                        if !client.gzipped {
                            bail!("http_gzip: the body is not gzipped");
                        }
                        check(&gunzip(client.body())?, &want, "http_gzip")?;
                        took
                    }
                    _ => {
                        let started = Instant::now();
                        floor_client.get("/metrics", &identity)?;
                        let took = started.elapsed();
                        check(floor_client.body(), &want, "tcp_floor")?;
                        took
                    }
                };
                if round > 0 {
                    kept.push(took);
                }
            }
        }
    }
    let medians: Vec<Duration> = samples
        .iter()
        .map(|s| crate::harness::quantile(s, 0.5))
        .collect();
    let export = medians[0].as_secs_f64();
    let mut csv =
        String::from("arm,what,samples,median_us,p10_us,p90_us,ratio_to_export,body_bytes\n");
    println!(
        "promlab serve-cost: {} ({} bytes, {} lines), strategies {}, {} rounds x {} per arm",
        args.store.display(),
        want.len(),
        want.iter().filter(|&&b| b == b'\n').count(),
        args.strategies,
        args.rounds,
        args.per_round
    );
    for (i, (arm, what)) in ARMS.iter().enumerate() {
        let s = &samples[i];
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let q = |p| us(crate::harness::quantile(s, p));
        let ratio = medians[i].as_secs_f64() / export;
        let bytes = match i {
            2 => 20,
            1 | 4 => gzip(&want)?.len(),
            _ => want.len(),
        };
        println!(
            "  {arm:<12} median {:>8.1} µs  (p10 {:>8.1}, p90 {:>8.1})  {ratio:>5.2}× export  — {what}",
            us(medians[i]),
            q(0.1),
            q(0.9)
        );
        csv += &format!(
            "{arm},\"{what}\",{},{:.1},{:.1},{:.1},{ratio:.3},{bytes}\n",
            s.len(),
            us(medians[i]),
            q(0.1),
            q(0.9)
        );
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("serve-cost.csv"), csv)?;
        write_machine(dir, args.strategies)?;
        println!("wrote {}", dir.display());
    }
    Ok(())
}

fn check(got: &[u8], want: &[u8], arm: &str) -> Result<()> {
    if got != want {
        bail!(
            "{arm}: the bytes differ from the in-process export ({} bytes against {})",
            got.len(),
            want.len()
        );
    }
    Ok(())
}

fn gzip(body: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 8),
        flate2::Compression::fast(),
    );
    encoder.write_all(body)?;
    Ok(encoder.finish()?)
}

fn gunzip(body: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body).read_to_end(&mut out)?;
    Ok(out)
}

/// `serve --store`'s router on its own runtime, in a thread of this process.
fn start_server(exporter: Exporter) -> Result<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("server".into())
        .spawn(move || {
            let router = app(Source::Store(Box::new(exporter)));
            let listen = SocketAddr::from(([127, 0, 0, 1], 0));
            let limits = crate::servers::ServerLimits::default();
            if let Err(e) = crate::servers::run(listen, None, router, limits, |addr| {
                let _ = tx.send(addr);
            }) {
                eprintln!("promlab serve-cost: server: {e:#}");
            }
        })?;
    rx.recv_timeout(Duration::from_secs(30))
        .context("the server did not start")
}

/// The `tcp_floor` server: a thread that answers every request on one
/// connection with `body`'s answer, made once, in one `write_all`.
fn start_floor_server(body: &[u8]) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let addr = listener.local_addr()?;
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {}\r\ncontent-length: {}\r\n\r\n",
        crate::servers::metrics::CONTENT_TYPE,
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body);
    std::thread::Builder::new().name("tcp-floor".into()).spawn(
        move || -> std::io::Result<()> {
            let (mut stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            // A floor is the least the move costs: a send buffer that takes
            // the whole answer at once, so this blocking write never waits
            // for room (the server's non-blocking writes hand its answer to
            // the kernel in one call with the kernel's own buffer).
            set_send_buffer(&stream, 2 << 20);
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                request.extend_from_slice(&buf[..n]);
                while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    request.drain(..end + 4);
                    stream.write_all(&answer)?;
                }
            }
        },
    )?;
    Ok(addr)
}

/// Asks for `bytes` of send buffer on `stream` (the kernel doubles it and
/// caps it at `net.core.wmem_max`; best effort).
fn set_send_buffer(stream: &TcpStream, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live c_int
    // and touches nothing else; the descriptor is the stream's own, open.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// One keep-alive HTTP/1.1 connection, as a scraper holds it: one buffer,
/// zeroed once, read into; the body is a range of it (no copy).
struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
    filled: usize,
    body_at: std::ops::Range<usize>,
    gzipped: bool,
}

impl Connection {
    fn open(addr: SocketAddr) -> Result<Connection> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Connection {
            stream,
            buf: vec![0; 4 << 20],
            filled: 0,
            body_at: 0..0,
            gzipped: false,
        })
    }

    fn body(&self) -> &[u8] {
        &self.buf[self.body_at.clone()]
    }

    /// Sends a GET and reads the whole answer (a `Content-Length` body).
    fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<()> {
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n");
        for (name, value) in headers {
            request += &format!("{name}: {value}\r\n");
        }
        request += "\r\n";
        self.stream.write_all(request.as_bytes())?;
        self.filled = 0;
        let head_end = loop {
            if let Some(at) = self.buf[..self.filled]
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
            {
                break at + 4;
            }
            self.fill()?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).context("head is not UTF-8")?;
        if !head.starts_with("HTTP/1.1 200") {
            bail!("{path}: {}", head.lines().next().unwrap_or(""));
        }
        let mut length = None;
        let mut gzipped = false;
        for line in head.lines() {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.trim().parse::<usize>()?);
            } else if name.eq_ignore_ascii_case("content-encoding") {
                gzipped = value.trim() == "gzip";
            }
        }
        self.gzipped = gzipped;
        let length = length.context("no Content-Length")?;
        if head_end + length > self.buf.len() {
            self.buf.resize(head_end + length, 0);
        }
        while self.filled < head_end + length {
            self.fill()?;
        }
        self.body_at = head_end..head_end + length;
        Ok(())
    }

    fn fill(&mut self) -> Result<()> {
        if self.filled == self.buf.len() {
            bail!("the answer is longer than announced");
        }
        let n = self.stream.read(&mut self.buf[self.filled..])?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        self.filled += n;
        Ok(())
    }
}

fn write_machine(dir: &std::path::Path, strategies: StrategySet) -> Result<()> {
    let host = crate::machine::Host::read();
    let build = crate::machine::BUILD;
    let load = crate::machine::LoadAverage::read().map_or("unknown".into(), |l| l.to_string());
    let text = format!(
        "cpu: {}\ncores: {}\nmemory: {}\nkernel: {}\nrustc: {}\ntarget: {}\nprofile: {} (opt-level {})\nstrategy set: {strategies}\ngit revision: {}\nload average at end (1, 5, 15 min): {load}\ndate: {}\nhost: {}\n",
        host.cpu.unwrap_or_default(),
        host.cores,
        host.memory_kib.map_or("unknown".into(), |k| format!("MemTotal: {k} kB")),
        host.kernel.unwrap_or_default(),
        build.rustc,
        build.target,
        build.profile,
        build.opt_level,
        build.git_revision,
        crate::machine::utc_now(),
        host.hostname.unwrap_or_default(),
    );
    std::fs::write(dir.join("machine.txt"), text)?;
    Ok(())
}
