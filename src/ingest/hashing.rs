//! The hasher of the maps an ingester keys by what senders send.

/// The hasher of a map keyed by bytes a sender chose (a series' raw label
/// bytes): seeded at random, per process and per map.
///
/// Why: with seeds fixed in the source, anyone who reads it can compute
/// label sets that all hash alike, and a request of them turns every lookup
/// and insert into a walk of one long probe chain — a few MB of remote write
/// that costs the receiver quadratic CPU (hash flooding). A seed the sender
/// cannot know makes such a set a guess. Nothing the receiver answers
/// depends on the seed: the cache is only looked up, never iterated into
/// anything that is served. `ahash` draws the process's seed from the OS
/// (`getrandom`) once and gives every `RandomState::new` its own keys from it.
/// The aggregations' group ids are found with it too; the ingester's other
/// maps keyed by network input (the per-sample router's groups, label maps)
/// are `std`'s `HashMap`s, whose SipHash keys are random per map already.
pub(crate) fn network_hasher() -> ahash::RandomState {
    ahash::RandomState::new()
}
