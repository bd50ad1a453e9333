//! RabbitMQ's per-object metrics at scale, as the `rabbitmq_prometheus` plugin
//! exposes them: `--queues N` queues, 2N channels and 2N connections give
//! 63 × N series (N = 10,000: 630,000), the shape of the "Pre-render prometheus
//! labels" report.
//!
//! Label values look like RabbitMQ's (`vhost="/"`, `queue="perf-test-4711"`,
//! `channel="<0.1234.0>"`, `exchange="direct"`); with awkward names on, some
//! vhosts, queues and exchanges carry `"`, `\`, newlines and non-ASCII, the
//! names that made RabbitMQ put escaping back.

use crate::format::registry::MetricType;
#[cfg(any(test, feature = "reference"))]
use crate::reference::live as live_reference;
use crate::render::live::{FamilyId, LiveRegistry};
use crate::shared::strategy::StrategySet;
use anyhow::Result;
use std::fmt;
use std::io::Write;

/// Which objects a group's series belong to, and so which labels they carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Objects {
    /// N queues: `vhost`, `queue`.
    Queues,
    /// 2N channels (or connections): `channel`.
    Channels,
    /// N channel–exchange pairs: `channel`, `vhost`, `exchange`.
    ChannelExchanges,
    /// N channel–queue pairs: `channel`, `vhost`, `queue`.
    ChannelQueues,
    /// N channel–queue–exchange triples.
    ChannelQueueExchanges,
}

impl Objects {
    fn labels(self) -> &'static [&'static str] {
        match self {
            Objects::Queues => &["vhost", "queue"],
            Objects::Channels => &["channel"],
            Objects::ChannelExchanges => &["channel", "vhost", "exchange"],
            Objects::ChannelQueues => &["channel", "vhost", "queue"],
            Objects::ChannelQueueExchanges => &[
                "channel",
                "queue_vhost",
                "queue",
                "exchange_vhost",
                "exchange",
            ],
        }
    }

    fn count(self, queues: usize) -> usize {
        match self {
            Objects::Channels => 2 * queues,
            _ => queues,
        }
    }
}

/// One family group of the per-object endpoint (`family=` of the detailed one).
struct Group {
    name: &'static str,
    objects: Objects,
    /// Metric names without the `rabbitmq_` prefix, and their help.
    metrics: &'static [(&'static str, &'static str)],
}

const GROUPS: &[Group] = &[
    Group {
        name: "queue_coarse_metrics",
        objects: Objects::Queues,
        metrics: &[
            ("queue_messages_ready", "Messages ready to be delivered to consumers"),
            ("queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
            ("queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
            ("queue_process_reductions_total", "Total number of queue process reductions"),
        ],
    },
    Group {
        name: "queue_metrics",
        objects: Objects::Queues,
        metrics: &[
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
        ],
    },
    Group {
        name: "channel_metrics",
        objects: Objects::Channels,
        metrics: &[
            ("channel_consumers", "Consumers on a channel"),
            ("channel_messages_unacked", "Delivered but not yet acknowledged messages"),
            ("channel_messages_unconfirmed", "Published but not yet confirmed messages"),
            ("channel_messages_uncommitted", "Messages received in a transaction but not yet committed"),
            ("channel_acks_uncommitted", "Message acknowledgements in a transaction not yet committed"),
            ("consumer_prefetch", "Limit of unacknowledged messages for each consumer"),
            ("channel_prefetch", "Total limit of unacknowledged messages for all consumers on a channel"),
        ],
    },
    Group {
        name: "channel_exchange_metrics",
        objects: Objects::ChannelExchanges,
        metrics: &[
            ("channel_messages_published_total", "Total number of messages published into an exchange on a channel"),
            ("channel_messages_confirmed_total", "Total number of messages published into an exchange and confirmed on the channel"),
            ("channel_messages_unroutable_returned_total", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable"),
            ("channel_messages_unroutable_dropped_total", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
        ],
    },
    Group {
        name: "channel_process_metrics",
        objects: Objects::Channels,
        metrics: &[("channel_process_reductions_total", "Total number of channel process reductions")],
    },
    Group {
        name: "channel_queue_metrics",
        objects: Objects::ChannelQueues,
        metrics: &[
            ("channel_get_ack_total", "Total number of messages fetched with basic.get in manual acknowledgement mode"),
            ("channel_get_total", "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
            ("channel_messages_delivered_ack_total", "Total number of messages delivered to consumers in manual acknowledgement mode"),
            ("channel_messages_delivered_total", "Total number of messages delivered to consumers in automatic acknowledgement mode"),
            ("channel_messages_redelivered_total", "Total number of messages redelivered to consumers"),
            ("channel_messages_acked_total", "Total number of messages acknowledged by consumers"),
            ("channel_get_empty_total", "Total number of times basic.get operations fetched no message"),
        ],
    },
    Group {
        name: "channel_queue_exchange_metrics",
        objects: Objects::ChannelQueueExchanges,
        metrics: &[("queue_messages_published_total", "Total number of messages published into a queue through an exchange on a channel")],
    },
    Group {
        name: "connection_coarse_metrics",
        objects: Objects::Channels,
        metrics: &[
            ("connection_incoming_bytes_total", "Total number of bytes received on a connection"),
            ("connection_outgoing_bytes_total", "Total number of bytes sent on a connection"),
            ("connection_process_reductions_total", "Total number of connection process reductions"),
        ],
    },
    Group {
        name: "connection_metrics",
        objects: Objects::Channels,
        metrics: &[
            ("connection_incoming_packets_total", "Total number of packets received on a connection"),
            ("connection_outgoing_packets_total", "Total number of packets sent on a connection"),
            ("connection_pending_packets", "Number of packets waiting to be sent on a connection"),
            ("connection_channels", "Channels on a connection"),
        ],
    },
];

/// Detailed-endpoint groups that name a subset of a per-object group's metrics
/// (RabbitMQ's `family=queue_consumer_count` gives only the consumer counts).
const ALIASES: &[(&str, &[&str])] = &[("queue_consumer_count", &["queue_consumers"])];

/// Series per queue of `--queues`: 4+17+4+7+1 per queue, 7+1+3+4 per channel (2 per queue).
pub const SERIES_PER_QUEUE: usize = 63;

/// The names `family=` accepts, in per-object order, aliases last.
pub fn family_names() -> impl Iterator<Item = &'static str> {
    GROUPS
        .iter()
        .map(|g| g.name)
        .chain(ALIASES.iter().map(|a| a.0))
}

/// A `family=` name that is not one of [`family_names`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFamily(pub String);

impl fmt::Display for UnknownFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let known: Vec<&str> = family_names().collect();
        write!(
            f,
            "unknown family `{}` (known: {})",
            self.0,
            known.join(", ")
        )
    }
}

impl std::error::Error for UnknownFamily {}

/// A simulated RabbitMQ node's metrics: a live registry of its per-object families whose values
/// move on every [`RabbitMqNode::advance`].
pub struct RabbitMqNode {
    registry: LiveRegistry,
    /// Per group (same order as [`GROUPS`]) its families.
    group_families: Vec<Vec<FamilyId>>,
    rng: SplitMix64,
}

impl RabbitMqNode {
    /// Builds the scenario at `queues` (all series created, values set once).
    pub fn build(
        queues: usize,
        awkward_names: bool,
        strategies: StrategySet,
    ) -> Result<RabbitMqNode> {
        let mut registry = LiveRegistry::new(strategies);
        let mut group_families = Vec::with_capacity(GROUPS.len());
        let mut names = Names::new(awkward_names);
        for group in GROUPS {
            let labels = group.objects.labels();
            let mut families = Vec::with_capacity(group.metrics.len());
            for (metric, help) in group.metrics {
                let family = registry.register(
                    &format!("rabbitmq_{metric}"),
                    kind_of(metric),
                    help,
                    labels,
                )?;
                for object in 0..group.objects.count(queues) {
                    let values = names.labels(group.objects, object);
                    registry.series(family, &values.as_slices())?;
                }
                families.push(family);
            }
            group_families.push(families);
        }
        let mut scenario = RabbitMqNode {
            registry,
            group_families,
            rng: SplitMix64(SEED),
        };
        scenario.advance();
        Ok(scenario)
    }

    pub fn registry(&self) -> &LiveRegistry {
        &self.registry
    }

    pub fn series_count(&self) -> usize {
        self.registry.series_count()
    }

    /// `/metrics/per-object`: clears `out`, writes every family.
    pub fn render_per_object(&self, out: &mut Vec<u8>) {
        self.registry.render_into(out);
    }

    /// The families of the named groups (each once, in per-object order).
    pub fn select<'a>(
        &self,
        groups: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<FamilyId>, UnknownFamily> {
        let mut wanted = vec![false; self.registry.family_count()];
        for name in groups {
            if let Some(g) = GROUPS.iter().position(|g| g.name == name) {
                for f in &self.group_families[g] {
                    wanted[f.index()] = true;
                }
            } else if let Some((_, metrics)) = ALIASES.iter().find(|a| a.0 == name) {
                for f in self.registry.family_ids() {
                    let metric = &self.registry.family_name(f)["rabbitmq_".len()..];
                    if metrics.contains(&metric) {
                        wanted[f.index()] = true;
                    }
                }
            } else {
                return Err(UnknownFamily(name.to_owned()));
            }
        }
        Ok(self
            .registry
            .family_ids()
            .filter(|f| wanted[f.index()])
            .collect())
    }

    /// `/metrics/detailed?family=...`: clears `out`, writes the named groups' families.
    pub fn render_detailed<'a>(
        &self,
        groups: impl IntoIterator<Item = &'a str>,
        out: &mut Vec<u8>,
    ) -> Result<(), UnknownFamily> {
        let families = self.select(groups)?;
        self.registry.render_families_into(&families, out);
        Ok(())
    }

    /// Moves every value as between two scrapes: counters grow, gauges wander.
    pub fn advance(&mut self) {
        for f in self.registry.family_ids().collect::<Vec<_>>() {
            let motion = Motion::of(&self.registry.family_name(f)["rabbitmq_".len()..]);
            let rng = &mut self.rng;
            for v in self.registry.values_mut(f) {
                *v = motion.next(*v, rng);
            }
        }
    }
}

/// The node's registry as plain data, after `advances` moves of its values
/// ([`RabbitMqNode::build`] makes the first; each [`RabbitMqNode::advance`]
/// one more): computed from the scenario's definition (its groups, names and
/// motions) without a registry, as the input of the reference renderer
/// ([`crate::reference::live`]).
#[cfg(any(test, feature = "reference"))]
pub fn contents(
    queues: usize,
    awkward_names: bool,
    advances: usize,
) -> Vec<live_reference::Family> {
    let mut names = Names::new(awkward_names);
    let mut families = Vec::new();
    for group in GROUPS {
        for (metric, help) in group.metrics {
            let series = (0..group.objects.count(queues))
                .map(|object| {
                    let values = names.labels(group.objects, object);
                    let values = values.as_slices().iter().map(|v| v.to_vec()).collect();
                    (values, 0.0)
                })
                .collect();
            families.push(live_reference::Family {
                name: format!("rabbitmq_{metric}"),
                kind: kind_of(metric),
                help: help.to_string(),
                label_names: group
                    .objects
                    .labels()
                    .iter()
                    .map(|l| l.to_string())
                    .collect(),
                series,
            });
        }
    }
    let mut rng = SplitMix64(SEED);
    for _ in 0..advances {
        for family in &mut families {
            let motion = Motion::of(&family.name["rabbitmq_".len()..]);
            for (_, value) in &mut family.series {
                *value = motion.next(*value, &mut rng);
            }
        }
    }
    families
}

/// The names of the families `groups` select (`family=` of the detailed
/// endpoint), in per-object order, from the scenario's definition.
pub fn selected_names<'a>(
    groups: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<String>, UnknownFamily> {
    let mut wanted: Vec<&str> = Vec::new();
    for name in groups {
        if let Some(group) = GROUPS.iter().find(|g| g.name == name) {
            wanted.extend(group.metrics.iter().map(|(m, _)| *m));
        } else if let Some((_, metrics)) = ALIASES.iter().find(|a| a.0 == name) {
            wanted.extend(metrics.iter().copied());
        } else {
            return Err(UnknownFamily(name.to_owned()));
        }
    }
    Ok(GROUPS
        .iter()
        .flat_map(|g| g.metrics.iter().map(|(m, _)| *m))
        .filter(|m| wanted.contains(m))
        .map(|m| format!("rabbitmq_{m}"))
        .collect())
}

/// Counters end in `_total`; the rest are gauges.
fn kind_of(metric: &str) -> MetricType {
    if metric.ends_with("_total") {
        MetricType::Counter
    } else {
        MetricType::Gauge
    }
}

/// The seed of the values' motion.
const SEED: u64 = 0x5eed_cafe;

/// Builds the scenario and renders it once with `strategies` (for ablation harnesses).
pub fn render_once(queues: usize, awkward_names: bool, strategies: StrategySet) -> Result<Vec<u8>> {
    let scenario = RabbitMqNode::build(queues, awkward_names, strategies)?;
    let mut out = Vec::new();
    scenario.render_per_object(&mut out);
    Ok(out)
}

/// How a metric's value moves between scrapes.
#[derive(Clone, Copy)]
enum Motion {
    /// Counters: grow by a small whole number.
    Counter,
    /// Ratios in [0, 1], full-precision fractions (the slow float path).
    Ratio,
    /// Byte sizes: whole numbers up to ~1e9.
    Bytes,
    /// Small counts: whole numbers up to 1,000.
    Count,
}

impl Motion {
    fn of(metric: &str) -> Motion {
        if metric.ends_with("_total") {
            Motion::Counter
        } else if metric.contains("capacity") || metric.contains("utilisation") {
            Motion::Ratio
        } else if metric.ends_with("_bytes") {
            Motion::Bytes
        } else {
            Motion::Count
        }
    }

    fn next(self, value: f64, rng: &mut SplitMix64) -> f64 {
        let r = rng.next();
        match self {
            Motion::Counter => value + (r % 100) as f64,
            Motion::Ratio => (r >> 11) as f64 / (1u64 << 53) as f64,
            Motion::Bytes => (r % 1_000_000_000) as f64,
            Motion::Count => (r % 1_000) as f64,
        }
    }
}

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

/// Label values of object `i`, written into reused buffers.
struct Names {
    awkward: bool,
    bufs: [Vec<u8>; 5],
}

/// A series' label values, borrowed from [`Names`].
struct LabelValues<'a> {
    bufs: &'a [Vec<u8>; 5],
    len: usize,
}

impl LabelValues<'_> {
    fn as_slices(&self) -> Vec<&[u8]> {
        self.bufs[..self.len].iter().map(|b| &b[..]).collect()
    }
}

const EXCHANGES: [&str; 4] = ["direct", "amq.direct", "amq.topic", "amq.fanout"];

impl Names {
    fn new(awkward: bool) -> Names {
        Names {
            awkward,
            bufs: Default::default(),
        }
    }

    fn labels(&mut self, objects: Objects, i: usize) -> LabelValues<'_> {
        let awkward = self.awkward;
        for b in &mut self.bufs {
            b.clear();
        }
        let [a, b, c, d, e] = &mut self.bufs;
        let len = match objects {
            Objects::Queues => {
                vhost(a, awkward, i);
                queue(b, awkward, i);
                2
            }
            Objects::Channels => {
                channel(a, i);
                1
            }
            Objects::ChannelExchanges => {
                channel(a, i);
                vhost(b, awkward, i);
                exchange(c, awkward, i);
                3
            }
            Objects::ChannelQueues => {
                channel(a, i);
                vhost(b, awkward, i);
                queue(c, awkward, i);
                3
            }
            Objects::ChannelQueueExchanges => {
                channel(a, i);
                vhost(b, awkward, i);
                queue(c, awkward, i);
                vhost(d, awkward, i + 1);
                exchange(e, awkward, i);
                5
            }
        };
        LabelValues {
            bufs: &self.bufs,
            len,
        }
    }
}

fn vhost(out: &mut Vec<u8>, awkward: bool, i: usize) {
    if awkward && i % 5 == 3 {
        out.extend_from_slice("vh \"prod\"\\eu\nzone-ü".as_bytes());
    } else {
        out.push(b'/');
    }
}

fn queue(out: &mut Vec<u8>, awkward: bool, i: usize) {
    if awkward && i % 7 == 3 {
        write!(out, "perf \"test\" \\ {i}\nsecond line ü 日本").expect("vec write");
    } else {
        write!(out, "perf-test-{i}").expect("vec write");
    }
}

fn channel(out: &mut Vec<u8>, i: usize) {
    write!(out, "<0.{}.0>", 1000 + i).expect("vec write");
}

fn exchange(out: &mut Vec<u8>, awkward: bool, i: usize) {
    if awkward && i % 11 == 5 {
        out.extend_from_slice("ex\\\"ch\"\n→".as_bytes());
    } else {
        out.extend_from_slice(EXCHANGES[i % EXCHANGES.len()].as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_count_matches_the_table() {
        let s = RabbitMqNode::build(3, true, StrategySet::NONE).unwrap();
        assert_eq!(s.series_count(), SERIES_PER_QUEUE * 3);
        let per_group: usize = GROUPS
            .iter()
            .map(|g| g.metrics.len() * g.objects.count(10_000))
            .sum();
        assert_eq!(per_group, 630_000);
    }

    #[test]
    fn detailed_selects_groups_and_refuses_unknown() {
        let s = RabbitMqNode::build(2, false, StrategySet::NONE).unwrap();
        assert_eq!(s.select(["queue_coarse_metrics"]).unwrap().len(), 4);
        assert_eq!(
            s.select(["queue_consumer_count", "queue_metrics"])
                .unwrap()
                .len(),
            17
        );
        assert_eq!(s.select(["queue_consumer_count"]).unwrap().len(), 1);
        let err = s.select(["queue_coarse_metrics", "bogus"]).unwrap_err();
        assert!(err.to_string().contains("unknown family `bogus`"));
    }
}
