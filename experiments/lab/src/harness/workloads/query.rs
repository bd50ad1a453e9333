//! Query: `/api/v1/quantiles?agg=data` — p50/p90/p99 of every group of the
//! last closed window — after the feeder's workload was ingested, per arm:
//! - each strategy set: the in-process answer (`Ingester::query_json`, the
//!   bytes the receiver sends; a closed window's answer is encoded once and
//!   kept, since a closed window never changes);
//! - `all-uncached`: the same bytes encoded afresh on every query;
//! - `all-serde`: the path before (`Ingester::query` into `QueryResult`s,
//!   then `serde_json`), for before/after in one run;
//! - `http`: the same answer over loopback from an in-process receiver;
//! - `floor`: the least work of serving a kept answer: copying it (the
//!   in-process arms return the answer kept for the closed window);
//! - `floor-uncached`: the least work of an answer computed afresh: the
//!   quantile scan (`Ingester::quantile_scan`) and the answer written around
//!   its values ([`AnswerFloor`]): `all-uncached` and `all-serde` are held to
//!   it. Each contract has its floor: a kept answer is held to a copy, not to
//!   a scan it does not do; and the floor of one computed afresh writes the
//!   answer's JSON too, which no arm can skip.
//!
//! The extra arms run every ingest strategy. Each strategy set has its own
//! ingester, fed once when the set first runs (its first query is verified).

use super::{ArmKind, Output, Workload};
use crate::http_client::Client;
use anyhow::{bail, Context, Result};
use promlab::ingest::feed::Generator;
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::shared::strategy::{Stage, StrategySet};
use std::collections::HashMap;
use std::time::Duration;

/// The aggregation the feeder's default plan defines.
pub(in crate::harness) const AGGREGATION: &str = "data";

/// A minute boundary, so `ticks = 66` closes exactly one full 60 s window.
pub(in crate::harness) const START_MS: i64 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000;

pub struct Query {
    generator: Generator,
    ticks: u64,
    ingesters: HashMap<StrategySet, Ingester>,
    out: Vec<u8>,
    /// The kept answer the copy floor copies: `all`'s, shared with its
    /// ingester (the same memory `all` copies from).
    kept: Option<std::sync::Arc<[u8]>>,
    /// Where the arms and the copy floor copy kept answers to.
    copies: PlacedCopies,
    /// The same answer, cut for the floor of one computed afresh.
    answer_floor: Option<AnswerFloor>,
    http: Option<Http>,
}

/// Where a kept answer is copied to, by the arms and the copy floor alike:
/// half a page from the source's offset in its page. A copy whose
/// destination sits a few bytes past its source's offset in a 4 KiB page runs
/// slower (4K aliasing: loads wait on stores with the same low 12 address
/// bits), and each arm's kept answer sits wherever its allocation fell, so
/// copies placed by chance spread with the allocator's dice. Placed alike
/// they still differ by their sources (other memory), so the floor copies
/// `all`'s kept answer itself, from where `all` keeps it.
struct PlacedCopies {
    /// A page more than the longest answer copied.
    buffer: Vec<u8>,
}

const PAGE: usize = 4096;

impl PlacedCopies {
    /// `source` copied to half a page from its offset in its page.
    fn copy(&mut self, source: &[u8]) -> &[u8] {
        if self.buffer.len() < source.len() + PAGE {
            self.buffer.resize(source.len() + PAGE, 0);
        }
        let base = self.buffer.as_ptr() as usize;
        let at = (source.as_ptr() as usize + PAGE / 2).wrapping_sub(base) % PAGE;
        let destination = &mut self.buffer[at..at + source.len()];
        destination.copy_from_slice(source);
        destination
    }
}

/// The floor of the answer computed afresh (the quantile scan, the answer written).
const FLOOR_UNCACHED: &str = "floor-uncached";

/// The answer written as the render floor writes an exposition: the kept
/// answer's text between its numbers copied, each number formatted (integers
/// — counts, the window's start — with `itoa`, the quantiles with `zmij`,
/// `serde_json`'s float formatter, which is faster here than `ryu`: the
/// floor must not format slower than the arms). The quantiles are the scan's, which visits the
/// panes in group-id order where the answer lists the groups by their labels,
/// so they land in other groups' places: the floor's bytes are not the
/// answer, it is checked by the groups it scanned.
struct AnswerFloor {
    /// Each distinct piece of text between numbers once: an answer repeats a
    /// few pieces (`,"quantiles":{"0.5":`, `,"0.9":`) once per group, and the
    /// arms write those from one copy each; cut whole, the floor would read
    /// more bytes a query than the arms do.
    text: Vec<u8>,
    /// Per number, the piece before it and whether it is a quantile.
    pieces: Vec<Piece>,
    /// The text after the last number.
    tail: Piece,
    /// The answer's integers (counts, the window's start), in order.
    integers: Vec<u64>,
}

/// A piece of [`AnswerFloor::text`] (8 bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Piece {
    start: u32,
    len: u16,
    /// Whether the number after it is a quantile (else the next integer).
    quantile: bool,
}

impl AnswerFloor {
    /// Cuts `answer` (JSON) around its numbers: a number is a token outside
    /// strings starting with a digit or `-`.
    fn new(answer: &[u8]) -> AnswerFloor {
        let mut floor = AnswerFloor {
            text: Vec::new(),
            pieces: Vec::new(),
            tail: Piece {
                start: 0,
                len: 0,
                quantile: false,
            },
            integers: Vec::new(),
        };
        let mut starts: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut piece_of = |floor: &mut AnswerFloor, bytes: &[u8], quantile: bool| {
            let start = *starts.entry(bytes.to_vec()).or_insert_with(|| {
                floor.text.extend_from_slice(bytes);
                (floor.text.len() - bytes.len()) as u32
            });
            let len =
                u16::try_from(bytes.len()).expect("a piece of text between numbers under 64 kB");
            Piece {
                start,
                len,
                quantile,
            }
        };
        let mut piece = Vec::new();
        let (mut i, mut in_string) = (0, false);
        while i < answer.len() {
            let b = answer[i];
            if in_string {
                piece.push(b);
                if b == b'\\' && i + 1 < answer.len() {
                    piece.push(answer[i + 1]);
                    i += 1;
                } else if b == b'"' {
                    in_string = false;
                }
                i += 1;
            } else if b == b'-' || b.is_ascii_digit() {
                let end = answer[i..]
                    .iter()
                    .position(|c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .map_or(answer.len(), |n| i + n);
                let token = std::str::from_utf8(&answer[i..end]).unwrap_or("");
                let integer = token.parse::<u64>().ok();
                let cut = piece_of(&mut floor, &piece, integer.is_none());
                floor.pieces.push(cut);
                floor.integers.extend(integer);
                piece.clear();
                i = end;
            } else {
                in_string = b == b'"';
                piece.push(b);
                i += 1;
            }
        }
        floor.tail = piece_of(&mut floor, &piece, false);
        floor
    }

    fn bytes(&self, piece: Piece) -> &[u8] {
        &self.text[piece.start as usize..][..piece.len as usize]
    }

    /// The answer written into `out` while `scan` hands over each pane's
    /// quantiles (one pass, as an arm writes each group's quantiles as it
    /// computes them); returns what `scan` returns.
    fn write(
        &self,
        out: &mut Vec<u8>,
        scan: impl FnOnce(&mut dyn FnMut(&[f64])) -> usize,
    ) -> usize {
        out.clear();
        out.reserve(self.text.len() + self.pieces.len() * 24);
        let mut writer = AnswerWriter {
            floor: self,
            next: 0,
            next_integer: 0,
            ints: itoa::Buffer::new(),
            floats: zmij::Buffer::new(),
        };
        let scanned = scan(&mut |quantiles| {
            for &v in quantiles {
                writer.quantile(out, v);
            }
        });
        writer.finish(out);
        scanned
    }
}

/// Where [`AnswerFloor::write`] is in the answer.
struct AnswerWriter<'a> {
    floor: &'a AnswerFloor,
    /// The next number's piece, and the next integer.
    next: usize,
    next_integer: usize,
    ints: itoa::Buffer,
    floats: zmij::Buffer,
}

impl AnswerWriter<'_> {
    /// The text and integers up to the next quantile, then `v` in its place.
    fn quantile(&mut self, out: &mut Vec<u8>, v: f64) {
        while let Some(integer) = self.number(out) {
            match integer {
                Some(n) => out.extend_from_slice(self.ints.format(n).as_bytes()),
                None => {
                    out.extend_from_slice(self.floats.format(v).as_bytes());
                    return;
                }
            }
        }
    }

    /// The rest of the answer (a quantile the scan did not hand over as 0).
    fn finish(&mut self, out: &mut Vec<u8>) {
        while let Some(integer) = self.number(out) {
            out.extend_from_slice(self.ints.format(integer.unwrap_or(0)).as_bytes());
        }
        out.extend_from_slice(self.floor.bytes(self.floor.tail));
    }

    /// The piece before the next number written; that number (`None`: a
    /// quantile), if any is left.
    fn number(&mut self, out: &mut Vec<u8>) -> Option<Option<u64>> {
        let piece = *self.floor.pieces.get(self.next)?;
        out.extend_from_slice(self.floor.bytes(piece));
        self.next += 1;
        if piece.quantile {
            return Some(None);
        }
        let integer = self.floor.integers[self.next_integer];
        self.next_integer += 1;
        Some(Some(integer))
    }
}

/// An in-process receiver on loopback, fed the workload under every strategy.
struct Http {
    /// Serves the receiver while the workload lives.
    _runtime: tokio::runtime::Runtime,
    url: String,
    client: Client,
}

impl Query {
    pub fn feeder(groups: u64, series_per_group: u64, ticks: u64) -> Result<Query> {
        Ok(Query {
            generator: super::feeder_workload(START_MS, groups, series_per_group).generator(),
            ticks,
            ingesters: HashMap::new(),
            out: Vec::new(),
            kept: None,
            copies: PlacedCopies { buffer: Vec::new() },
            answer_floor: None,
            http: None,
        })
    }

    /// A receiver's state after the workload, as it runs (no flush: the last
    /// closed window is the one the watermark closed).
    fn ingest(&self, strategies: StrategySet) -> Result<Ingester> {
        let mut ingester = Ingester::new(Plan::default(), strategies);
        for t in 0..self.ticks {
            for body in self.generator.tick_bodies(t) {
                ingester.handle(&body)?;
            }
        }
        Ok(ingester)
    }

    fn ingester(&mut self, strategies: StrategySet) -> Result<&Ingester> {
        // Only the ingest strategies change an ingester.
        let key = strategies.restrict(Stage::Ingest);
        if !self.ingesters.contains_key(&key) {
            let ingester = self.ingest(key)?;
            self.ingesters.insert(key, ingester);
        }
        Ok(&self.ingesters[&key])
    }

    fn http(&mut self) -> Result<&Http> {
        if self.http.is_none() {
            let ingester = self.ingest(StrategySet::all().restrict(Stage::Ingest))?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?;
            let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
            let addr = listener.local_addr()?;
            let receiver = crate::servers::receiver::Receiver::new(ingester.into(), None, 32 << 20);
            let app = crate::servers::receiver::app(receiver);
            // As `promlab serve` does: no Nagle wait on an answer's last segment.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            runtime.spawn(async move { axum::serve(listener, app).await });
            self.http = Some(Http {
                _runtime: runtime,
                url: format!("http://{addr}/api/v1/quantiles?agg={AGGREGATION}"),
                client: Client::new(Some(Duration::from_secs(30)), 1),
            });
        }
        Ok(self.http.as_ref().expect("started above"))
    }
}

impl Workload for Query {
    /// The answer kept for the closed window, copied out as the copy floor
    /// copies ([`PlacedCopies`]); the first query of a set encodes it.
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        self.ingester(strategies)?;
        let ingester = &self.ingesters[&strategies.restrict(Stage::Ingest)];
        if let Some(kept) = ingester.kept_answer(AGGREGATION, None) {
            return Ok(Output::Bytes(self.copies.copy(kept)));
        }
        self.out.clear();
        if !ingester.query_json(AGGREGATION, None, &mut self.out) {
            bail!("no aggregation `{AGGREGATION}`");
        }
        Ok(Output::Bytes(&self.out))
    }

    /// The groups of the feeder's workload (each has a pane in the window).
    fn units(&self) -> (u64, &'static str) {
        (self.generator.workload.groups, "groups")
    }

    /// A kept answer copied: the least work of serving it (the answer `all`
    /// keeps, taken once from its ingester, copied as the arms copy theirs).
    fn floor(&mut self) -> Result<Output<'_>> {
        if self.kept.is_none() {
            let all = StrategySet::all().restrict(Stage::Ingest);
            let ingester = self.ingester(all)?;
            if !ingester.query_json(AGGREGATION, None, &mut Vec::new()) {
                bail!("no aggregation `{AGGREGATION}`");
            }
            let kept = ingester.kept_answer(AGGREGATION, None);
            self.kept = Some(
                kept.context("no closed window to keep an answer of")?
                    .clone(),
            );
        }
        let kept = self.kept.as_deref().expect("taken above");
        Ok(Output::Bytes(self.copies.copy(kept)))
    }

    /// The answers computed afresh are held to the quantile scan.
    fn floor_of(&self, arm: &str, _strategies: StrategySet) -> &'static str {
        match arm {
            "all-uncached" | "all-serde" => FLOOR_UNCACHED,
            _ => super::FLOOR,
        }
    }

    /// The other paths to the answer, every ingest strategy on, and the
    /// floor of an answer computed afresh.
    fn extra_arms(&self, _all: StrategySet) -> Vec<(&'static str, StrategySet, ArmKind)> {
        let all = StrategySet::all().restrict(Stage::Ingest);
        vec![
            ("all-uncached", all, ArmKind::Extra),
            ("all-serde", all, ArmKind::Extra),
            ("http", all, ArmKind::Extra),
            (FLOOR_UNCACHED, all, ArmKind::Floor),
        ]
    }

    fn run_extra(&mut self, name: &str, strategies: StrategySet) -> Result<Output<'_>> {
        if name == FLOOR_UNCACHED {
            // Every group's pane's quantiles, the answer written around them
            // as they come: no sorting, no labels encoded, no pane looked up.
            self.ingester(strategies)?;
            let ingester = &self.ingesters[&strategies.restrict(Stage::Ingest)];
            if self.answer_floor.is_none() {
                let mut answer = Vec::new();
                ingester.encode_query(AGGREGATION, None, &mut answer);
                self.answer_floor = Some(AnswerFloor::new(&answer));
            }
            let floor = self.answer_floor.as_ref().expect("made above");
            let groups = floor.write(&mut self.out, |f| {
                ingester.quantile_scan(AGGREGATION, None, f).unwrap_or(0)
            });
            std::hint::black_box(&self.out);
            return Ok(Output::Units(groups as u64));
        }
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        match name {
            "all-uncached" => {
                self.ingester(strategies)?
                    .encode_query(AGGREGATION, None, &mut out);
            }
            "all-serde" => {
                let result = self.ingester(strategies)?.query(AGGREGATION, None);
                serde_json::to_writer(&mut out, &result.context("no aggregation")?)?;
            }
            "http" => {
                let http = self.http()?;
                let (status, _) = http.client.get_into(&http.url, &[], &mut out)?;
                if status != 200 {
                    bail!("GET {}: status {status}", http.url);
                }
            }
            _ => bail!("no extra arm `{name}`"),
        }
        self.out = out;
        Ok(Output::Bytes(&self.out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor cuts an answer around its numbers only (not digits in
    /// labels), and with the answer's own quantiles writes it back.
    #[test]
    fn the_answer_floor_writes_the_answer_around_its_numbers() {
        let answer = br#"{"aggregation":"data","window_start_ms":1700000040000,"groups":[{"labels":{"label_0":"g1-2 \"3\""},"count":60,"quantiles":{"0.5":1.0,"0.9":2.5e-7,"0.99":-12.75}},{"labels":{},"count":7,"dropped":2,"quantiles":{"0.5":3.0,"0.9":null,"0.99":1e+20}}]}"#;
        // (`serde_json`'s form of 1e20, as the answer has it.)
        assert_eq!(serde_json::to_string(&1e20).unwrap(), "1e+20");
        let floor = AnswerFloor::new(answer);
        assert_eq!(floor.integers, [1_700_000_040_000, 60, 7, 2]);
        let quantiles: Vec<bool> = floor.pieces.iter().map(|p| p.quantile).collect();
        assert_eq!(
            quantiles,
            [false, false, true, true, true, false, false, true, true]
        );
        // `,"quantiles":{"0.5":` once, though the answer has it twice.
        assert_eq!(floor.pieces[2], floor.pieces[7]);
        let mut out = Vec::new();
        let scanned = floor.write(&mut out, |f| {
            f(&[1.0, 2.5e-7, -12.75]);
            f(&[3.0, 1e20]);
            2
        });
        assert_eq!(scanned, 2);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            std::str::from_utf8(answer).unwrap()
        );
    }
}
