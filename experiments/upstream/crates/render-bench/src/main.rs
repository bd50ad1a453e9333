//! RabbitMQ's per-object metrics (promlab's `rabbitmq-per-object` scenario: N
//! queues give 63 × N series, N = 10,000 → 630,000) in `prometheus-client`
//! registries built the way promlab's peer builds them
//! (`src/harness/peers/crates_render.rs`): one `Family<Vec<(String, String)>, _>`
//! per metric, counters as `Counter<f64, AtomicU64>` (the crate appends
//! `_total`), gauges as `Gauge<f64, AtomicU64>`, one encode with
//! `encoding::text::encode` into a reused `String` per scrape.
//!
//! Arms, timed interleaved in the same process:
//! - `published`: the crates.io release, unpatched;
//! - `patched`: the patched crate with the same plain `Vec<(String, String)>`
//!   keys (what the patch costs those who do not use it);
//! - `patched+cache`: the patched crate with `CachedLabelSet<Vec<(String, String)>>`
//!   keys, whose text encodings are kept after the first scrape.
//!
//! Checked before timing, on every arm's first and second scrape: the same
//! byte count, and the same lines once each family's sample lines are sorted
//! (three `HashMap`s iterate their series in three orders; the family headers
//! and their order must match exactly). That the cached encoding is the plain
//! one byte for byte is what the patch's own tests check (encoder level, and
//! whole expositions of one-series families).
//!
//! Usage: render-bench [--queues N] [--rounds R] [--plain-names] [--patched-first] [--out FILE.csv]
//!
//! `--patched-first` builds the patched registries before the published one
//! (a control: allocation order decides where each map's keys land in memory).

use std::io::Write as _;
use std::time::Instant;

/// Which objects a group's series belong to, and so which labels they carry.
#[derive(Clone, Copy)]
enum Objects {
    Queues,
    Channels,
    ChannelExchanges,
    ChannelQueues,
    ChannelQueueExchanges,
}

impl Objects {
    fn labels(self) -> &'static [&'static str] {
        match self {
            Objects::Queues => &["vhost", "queue"],
            Objects::Channels => &["channel"],
            Objects::ChannelExchanges => &["channel", "vhost", "exchange"],
            Objects::ChannelQueues => &["channel", "vhost", "queue"],
            Objects::ChannelQueueExchanges => {
                &["channel", "queue_vhost", "queue", "exchange_vhost", "exchange"]
            }
        }
    }

    fn count(self, queues: usize) -> usize {
        match self {
            Objects::Channels => 2 * queues,
            _ => queues,
        }
    }

    fn values(self, awkward: bool, i: usize) -> Vec<String> {
        match self {
            Objects::Queues => vec![vhost(awkward, i), queue(awkward, i)],
            Objects::Channels => vec![channel(i)],
            Objects::ChannelExchanges => vec![channel(i), vhost(awkward, i), exchange(awkward, i)],
            Objects::ChannelQueues => vec![channel(i), vhost(awkward, i), queue(awkward, i)],
            Objects::ChannelQueueExchanges => vec![
                channel(i),
                vhost(awkward, i),
                queue(awkward, i),
                vhost(awkward, i + 1),
                exchange(awkward, i),
            ],
        }
    }
}

// promlab's `src/scenarios/rabbitmq.rs` tables (metric names and help texts).
const GROUPS: &[(Objects, &[(&str, &str)])] = &[
    (Objects::Queues, &[
        ("queue_messages_ready", "Messages ready to be delivered to consumers"),
        ("queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
        ("queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
        ("queue_process_reductions_total", "Total number of queue process reductions"),
    ]),
    (Objects::Queues, &[
        ("queue_consumers", "Consumers on a queue"),
        ("queue_consumer_capacity", "Consumer capacity"),
        ("queue_consumer_utilisation", "Same as consumer capacity"),
        ("queue_process_memory_bytes", "Memory in bytes used by the Erlang queue process"),
        ("queue_messages_ram", "Ready and unacknowledged messages stored in memory"),
        ("queue_messages_ram_bytes", "Size of ready and unacknowledged messages stored in memory"),
        ("queue_messages_ready_ram", "Ready messages stored in memory"),
        ("queue_messages_unacked_ram", "Unacknowledged messages stored in memory"),
        ("queue_messages_persistent", "Persistent messages"),
        ("queue_messages_persistent_bytes", "Size in bytes of persistent messages"),
        ("queue_messages_bytes", "Size in bytes of ready and unacknowledged messages"),
        ("queue_messages_ready_bytes", "Size in bytes of ready messages"),
        ("queue_messages_unacked_bytes", "Size in bytes of all unacknowledged messages"),
        ("queue_messages_paged_out", "Messages paged out to disk"),
        ("queue_messages_paged_out_bytes", "Size in bytes of messages paged out to disk"),
        ("queue_disk_reads_total", "Total number of times queue read messages from disk"),
        ("queue_disk_writes_total", "Total number of times queue wrote messages to disk"),
    ]),
    (Objects::Channels, &[
        ("channel_consumers", "Consumers on a channel"),
        ("channel_messages_unacked", "Delivered but not yet acknowledged messages"),
        ("channel_messages_unconfirmed", "Published but not yet confirmed messages"),
        ("channel_messages_uncommitted", "Messages received in a transaction but not yet committed"),
        ("channel_acks_uncommitted", "Message acknowledgements in a transaction not yet committed"),
        ("consumer_prefetch", "Limit of unacknowledged messages for each consumer"),
        ("channel_prefetch", "Total limit of unacknowledged messages for all consumers on a channel"),
    ]),
    (Objects::ChannelExchanges, &[
        ("channel_messages_published_total", "Total number of messages published into an exchange on a channel"),
        ("channel_messages_confirmed_total", "Total number of messages published into an exchange and confirmed on the channel"),
        ("channel_messages_unroutable_returned_total", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable"),
        ("channel_messages_unroutable_dropped_total", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    ]),
    (Objects::Channels, &[("channel_process_reductions_total", "Total number of channel process reductions")]),
    (Objects::ChannelQueues, &[
        ("channel_get_ack_total", "Total number of messages fetched with basic.get in manual acknowledgement mode"),
        ("channel_get_total", "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
        ("channel_messages_delivered_ack_total", "Total number of messages delivered to consumers in manual acknowledgement mode"),
        ("channel_messages_delivered_total", "Total number of messages delivered to consumers in automatic acknowledgement mode"),
        ("channel_messages_redelivered_total", "Total number of messages redelivered to consumers"),
        ("channel_messages_acked_total", "Total number of messages acknowledged by consumers"),
        ("channel_get_empty_total", "Total number of times basic.get operations fetched no message"),
    ]),
    (Objects::ChannelQueueExchanges, &[("queue_messages_published_total", "Total number of messages published into a queue through an exchange on a channel")]),
    (Objects::Channels, &[
        ("connection_incoming_bytes_total", "Total number of bytes received on a connection"),
        ("connection_outgoing_bytes_total", "Total number of bytes sent on a connection"),
        ("connection_process_reductions_total", "Total number of connection process reductions"),
    ]),
    (Objects::Channels, &[
        ("connection_incoming_packets_total", "Total number of packets received on a connection"),
        ("connection_outgoing_packets_total", "Total number of packets sent on a connection"),
        ("connection_pending_packets", "Number of packets waiting to be sent on a connection"),
        ("connection_channels", "Channels on a connection"),
    ]),
];

const EXCHANGES: [&str; 4] = ["direct", "amq.direct", "amq.topic", "amq.fanout"];

fn vhost(awkward: bool, i: usize) -> String {
    if awkward && i % 5 == 3 {
        "vh \"prod\"\\eu\nzone-ü".to_owned()
    } else {
        "/".to_owned()
    }
}

fn queue(awkward: bool, i: usize) -> String {
    if awkward && i % 7 == 3 {
        format!("perf \"test\" \\ {i}\nsecond line ü 日本")
    } else {
        format!("perf-test-{i}")
    }
}

fn channel(i: usize) -> String {
    format!("<0.{}.0>", 1000 + i)
}

fn exchange(awkward: bool, i: usize) -> String {
    if awkward && i % 11 == 5 {
        "ex\\\"ch\"\n→".to_owned()
    } else {
        EXCHANGES[i % EXCHANGES.len()].to_owned()
    }
}

/// promlab's value motion after one `advance` from zero: counters small whole
/// numbers, ratios full-precision fractions, byte sizes up to 1e9, counts up
/// to 1,000; one SplitMix64 stream over all series in order.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn value(metric: &str, rng: &mut SplitMix64) -> f64 {
    let r = rng.next();
    if metric.ends_with("_total") {
        (r % 100) as f64
    } else if metric.contains("capacity") || metric.contains("utilisation") {
        (r >> 11) as f64 / (1u64 << 53) as f64
    } else if metric.ends_with("_bytes") {
        (r % 1_000_000_000) as f64
    } else {
        (r % 1_000) as f64
    }
}

/// One metric family of the scenario: name, help, kind, series.
struct Family {
    name: String,
    help: &'static str,
    counter: bool,
    series: Vec<(Vec<(String, String)>, f64)>,
}

fn scenario(queues: usize, awkward: bool) -> Vec<Family> {
    let mut rng = SplitMix64(0x5eed_cafe);
    let mut families = Vec::new();
    for (objects, metrics) in GROUPS {
        for (metric, help) in *metrics {
            let series = (0..objects.count(queues))
                .map(|i| {
                    let labels = objects
                        .labels()
                        .iter()
                        .zip(objects.values(awkward, i))
                        .map(|(k, v)| (k.to_string(), v))
                        .collect();
                    (labels, 0.0)
                })
                .collect();
            families.push(Family {
                name: format!("rabbitmq_{metric}"),
                help,
                counter: metric.ends_with("_total"),
                series,
            });
        }
    }
    for f in &mut families {
        let metric = f.name["rabbitmq_".len()..].to_owned();
        for (_, v) in &mut f.series {
            *v = value(&metric, &mut rng);
        }
    }
    families
}

/// The same registry construction for both crate versions (the crates are two
/// distinct types, so a macro rather than a generic function).
macro_rules! build {
    ($krate:ident, $families:expr,) => {{
        use std::sync::atomic::AtomicU64;
        use $krate::metrics::counter::Counter;
        use $krate::metrics::family::Family;
        use $krate::metrics::gauge::Gauge;
        let mut registry = $krate::registry::Registry::default();
        for f in $families {
            if f.counter {
                let family = Family::<Vec<(String, String)>, Counter<f64, AtomicU64>>::default();
                registry.register(f.name.strip_suffix("_total").unwrap_or(&f.name), f.help, family.clone());
                for (labels, v) in &f.series {
                    family.get_or_create(labels).inc_by(*v);
                }
            } else {
                let family = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
                registry.register(&f.name, f.help, family.clone());
                for (labels, v) in &f.series {
                    family.get_or_create(labels).set(*v);
                }
            }
        }
        registry
    }};
}

/// The patched crate with `CachedLabelSet` keys (the patch's opt-in).
fn build_cached(families: &[Family]) -> pc_patched::registry::Registry {
    use pc_patched::encoding::CachedLabelSet;
    use pc_patched::metrics::counter::Counter;
    use pc_patched::metrics::family::Family as F;
    use pc_patched::metrics::gauge::Gauge;
    use std::sync::atomic::AtomicU64;
    type Key = CachedLabelSet<Vec<(String, String)>>;
    let mut registry = pc_patched::registry::Registry::default();
    for f in families {
        if f.counter {
            let family = F::<Key, Counter<f64, AtomicU64>>::default();
            registry.register(f.name.strip_suffix("_total").unwrap_or(&f.name), f.help, family.clone());
            for (labels, v) in &f.series {
                family.get_or_create(&CachedLabelSet::new(labels.clone())).inc_by(*v);
            }
        } else {
            let family = F::<Key, Gauge<f64, AtomicU64>>::default();
            registry.register(&f.name, f.help, family.clone());
            for (labels, v) in &f.series {
                family.get_or_create(&CachedLabelSet::new(labels.clone())).set(*v);
            }
        }
    }
    registry
}

/// Each family's header lines as they are, its sample lines sorted.
fn canonical(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut samples: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            samples.sort_unstable();
            out.append(&mut samples);
            out.push(line);
        } else {
            samples.push(line);
        }
    }
    samples.sort_unstable();
    out.append(&mut samples);
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut queues = 10_000usize;
    let mut rounds = 21usize;
    let mut awkward = true;
    let mut out_csv: Option<String> = None;
    let mut patched_first = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--queues" => queues = args.next().expect("--queues N").parse().expect("a number"),
            "--rounds" => rounds = args.next().expect("--rounds R").parse().expect("a number"),
            "--plain-names" => awkward = false,
            "--out" => out_csv = Some(args.next().expect("--out FILE")),
            "--patched-first" => patched_first = true,
            _ => panic!("usage: render-bench [--queues N] [--rounds R] [--plain-names] [--patched-first] [--out FILE.csv]"),
        }
    }

    let t = Instant::now();
    let families = scenario(queues, awkward);
    let series: usize = families.iter().map(|f| f.series.len()).sum();
    let (published, patched, cached) = if patched_first {
        let patched = build!(pc_patched, &families,);
        let cached = build_cached(&families);
        (build!(pc_published, &families,), patched, cached)
    } else {
        let published = build!(pc_published, &families,);
        (published, build!(pc_patched, &families,), build_cached(&families))
    };
    drop(families);
    eprintln!(
        "built {series} series ({} families, queues = {queues}, awkward names = {awkward}, {} built first) in {:.1} s",
        GROUPS.iter().map(|g| g.1.len()).sum::<usize>(),
        if patched_first { "patched" } else { "published" },
        t.elapsed().as_secs_f64()
    );

    // Checks, and the cache's one-time fill (the first scrape of `cached`).
    let mut expected = String::new();
    pc_published::encoding::text::encode(&mut expected, &published).unwrap();
    let expected_lines = canonical(&expected);
    let check = |arm: &str, text: &str| {
        assert_eq!(text.len(), expected.len(), "{arm}: byte count differs from published");
        assert!(canonical(text) == expected_lines, "{arm}: lines differ from published");
    };
    let mut first = String::new();
    let t = Instant::now();
    pc_patched::encoding::text::encode(&mut first, &cached).unwrap();
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    check("patched+cache, first scrape (cache filled)", &first);
    first.clear();
    pc_patched::encoding::text::encode(&mut first, &cached).unwrap();
    check("patched+cache, second scrape (cache read)", &first);
    for _ in 0..2 {
        first.clear();
        pc_patched::encoding::text::encode(&mut first, &patched).unwrap();
        check("patched", &first);
        first.clear();
        pc_published::encoding::text::encode(&mut first, &published).unwrap();
        check("published, again", &first);
    }
    let lines = expected.lines().count();
    eprintln!(
        "checked (first and second scrape of each arm): same {} bytes, same {lines} lines per family, headers in the same order",
        expected.len()
    );
    drop(first);

    // Interleaved rounds, one scrape per arm per round, into reused buffers.
    let arms = ["published", "patched", "patched+cache"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    let mut bufs: Vec<String> = (0..arms.len()).map(|_| String::with_capacity(expected.len())).collect();
    for round in 0..rounds {
        for k in 0..arms.len() {
            // Rotate the order so no arm always runs first.
            let a = (k + round) % arms.len();
            let buf = &mut bufs[a];
            buf.clear();
            let t = Instant::now();
            match a {
                0 => pc_published::encoding::text::encode(buf, &published).unwrap(),
                1 => pc_patched::encoding::text::encode(buf, &patched).unwrap(),
                _ => pc_patched::encoding::text::encode(buf, &cached).unwrap(),
            }
            times[a].push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(buf.len(), expected.len());
        }
    }

    let mut csv = String::from("arm,round,ms\n");
    for (a, ts) in times.iter().enumerate() {
        for (r, t) in ts.iter().enumerate() {
            csv.push_str(&format!("{},{r},{t:.4}\n", arms[a]));
        }
    }
    let medians: Vec<f64> = times.iter().map(|t| median(&mut t.clone())).collect();
    println!("| arm | median per scrape | lines/s | vs published |");
    println!("| --- | ---: | ---: | ---: |");
    for (a, m) in medians.iter().enumerate() {
        println!(
            "| {} | {:.2} ms | {:.2} M | {:.2}× |",
            arms[a],
            m,
            lines as f64 / (m / 1e3) / 1e6,
            medians[0] / m
        );
    }
    println!(
        "\n{series} series, {lines} lines, {} bytes; {rounds} interleaved rounds; patched+cache first scrape (cache filled): {first_ms:.2} ms",
        expected.len()
    );
    if let Some(path) = out_csv {
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(csv.as_bytes()))
            .expect("write the CSV");
    }
}
