//! What the lanes of one ingester share: the [`Budget`] every limit counts
//! against ([`super::budget`]), and the [`GroupTable`] (each aggregation's
//! groups, their ids and destination ids). A lone [`Ingester`](super::pipeline::Ingester) has both
//! to itself; a [laned](super::lanes) one hands every lane the same, so the
//! limits are the receiver's, not a lane's, and a group has one id in every
//! lane (a window's panes from several lanes merge by id).
//!
//! **Groups** are reclaimed when no window holds a pane of theirs any more —
//! neither an open window of any lane nor a kept closed one — so a group that
//! went quiet is gone `keep_windows` closed windows after its last samples,
//! and after a flood new groups are admitted again once the flood's windows
//! have aged out. Reclaiming reuses group and destination ids, so every
//! lane's series cache is cleared with it; it is done in batches (when a
//! sixteenth of the groups held can go, or the groups are at three quarters
//! of their limit), at a window's close, with every lane stopped.

use super::budget::{Budget, Capacity};
use super::group_key::{group_key_values, unescape_group_value};
use super::hashing::network_hasher;
use super::plan::Aggregation;
use std::sync::atomic::Ordering;

/// Bytes a group is counted against `group_bytes` beyond twice its key (held
/// once, and as its labels in the answers' JSON heads): its entry in the map
/// and in the group list, and malloc headers.
pub const GROUP_BYTES: usize = 192;

/// What a group of key `key` is counted against `group_bytes`.
fn group_bytes(key: &[u8]) -> usize {
    GROUP_BYTES + 2 * key.len()
}

/// The group id of an aggregation's overflow group: every new group past the
/// group limit gets it, and its samples are counted and dropped.
pub const OVERFLOW: u32 = u32::MAX;

/// One group of an aggregation.
#[derive(Debug)]
pub struct Group {
    /// Its key ([`write_group_key`](super::group_key::write_group_key)'s): what
    /// the aggregation finds it by, and what its labels are read from. One
    /// allocation per group, not four (a map key, a vector of labels, a name
    /// and a value): a table may hold a million groups.
    key: Box<[u8]>,
    /// Its destination id (what the series cache and the routers carry).
    pub dest: u32,
}

/// One aggregation's groups.
#[derive(Debug)]
pub struct AggGroups {
    group_by: Vec<String>,
    /// Group ids, found by their group's key: keys come from senders, so the
    /// hash is seeded at random (see `network_hasher`).
    ids: hashbrown::HashTable<u32>,
    hasher: ahash::RandomState,
    /// By group id; `None` for an id free for reuse.
    groups: Vec<Option<Group>>,
    free: Vec<u32>,
    /// The destination id of the overflow group, once it has one.
    overflow_dest: Option<u32>,
    /// Bumped whenever a group is added or reclaimed (answers' group order is rebuilt then).
    pub version: u64,
}

impl AggGroups {
    fn new(agg: &Aggregation) -> Self {
        AggGroups {
            group_by: agg.group_by.clone(),
            ids: hashbrown::HashTable::new(),
            hasher: network_hasher(),
            groups: Vec::new(),
            free: Vec::new(),
            overflow_dest: None,
            version: 0,
        }
    }

    /// Group `gid`, if it is one (not free, not the overflow group).
    pub fn get(&self, gid: u32) -> Option<&Group> {
        self.groups.get(gid as usize)?.as_ref()
    }

    /// The id of the group of key `key`, if there is one.
    fn find(&self, key: &[u8]) -> Option<u32> {
        let groups = &self.groups;
        self.ids
            .find(self.hasher.hash_one(key), |&gid| key_of(groups, gid) == key)
            .copied()
    }

    /// Group `gid`'s labels that are present, in group-by order, each as its
    /// name and its value's bytes ([`AggGroups::labels`] without allocating);
    /// none for an id that is not a group.
    pub fn for_each_label<'a>(&'a self, gid: u32, mut f: impl FnMut(&'a str, &[u8])) {
        let Some(group) = self.get(gid) else { return };
        let mut value = Vec::new();
        for (name, range) in self.group_by.iter().zip(group_key_values(&group.key)) {
            let raw = &group.key[range];
            if raw.is_empty() {
                continue;
            }
            if raw.contains(&b'\\') {
                value.clear();
                unescape_group_value(&mut value, raw);
                f(name, &value);
            } else {
                f(name, raw);
            }
        }
    }

    /// Group `gid`'s labels that are present, in group-by order (none for an
    /// id that is not a group).
    pub fn labels(&self, gid: u32) -> Vec<(String, String)> {
        let mut labels = Vec::new();
        self.for_each_label(gid, |name, value| {
            labels.push((name.to_owned(), String::from_utf8_lossy(value).into_owned()));
        });
        labels
    }

    /// Group ids in use are below this.
    pub fn id_bound(&self) -> usize {
        self.groups.len()
    }

    /// Groups held.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// The key of group `gid` (a group's id in the map is always a group).
fn key_of(groups: &[Option<Group>], gid: u32) -> &[u8] {
    &groups[gid as usize]
        .as_ref()
        .expect("an id in the map is a group")
        .key
}

/// Every aggregation's groups, and the destination ids over all of them.
#[derive(Debug, Default)]
pub struct GroupTable {
    aggs: Vec<AggGroups>,
    /// Destination id → (aggregation, group id); `None` when free.
    dests: Vec<Option<(u16, u32)>>,
    free_dests: Vec<u32>,
    /// The plan generation the aggregations are of.
    generation: u64,
}

impl GroupTable {
    pub fn agg(&self, agg: usize) -> &AggGroups {
        &self.aggs[agg]
    }

    fn new_dest(&mut self, to: (u16, u32)) -> u32 {
        match self.free_dests.pop() {
            Some(d) => {
                self.dests[d as usize] = Some(to);
                d
            }
            None => {
                self.dests.push(Some(to));
                (self.dests.len() - 1) as u32
            }
        }
    }

    /// The (group id, destination id) of a group key of aggregation `agg`,
    /// creating the group on first sight; past the budget's group limit, the
    /// overflow group's ([`OVERFLOW`]).
    pub fn intern(&mut self, agg: u16, key: &[u8], budget: &Budget) -> (u32, u32) {
        let groups = &self.aggs[agg as usize];
        if let Some(gid) = groups.find(key) {
            let group = groups.get(gid).expect("an id in the map is a group");
            return (gid, group.dest);
        }
        if !budget.try_take_group(group_bytes(key)) {
            let dest = match self.aggs[agg as usize].overflow_dest {
                Some(d) => d,
                None => {
                    let d = self.new_dest((agg, OVERFLOW));
                    self.aggs[agg as usize].overflow_dest = Some(d);
                    d
                }
            };
            return (OVERFLOW, dest);
        }
        let gid = match self.aggs[agg as usize].free.pop() {
            Some(gid) => gid,
            None => {
                let groups = &mut self.aggs[agg as usize].groups;
                groups.push(None);
                (groups.len() - 1) as u32
            }
        };
        let dest = self.new_dest((agg, gid));
        let groups = &mut self.aggs[agg as usize];
        groups.groups[gid as usize] = Some(Group {
            key: key.into(),
            dest,
        });
        let AggGroups {
            ids,
            hasher,
            groups: list,
            ..
        } = groups;
        ids.insert_unique(hasher.hash_one(key), gid, |&g| {
            hasher.hash_one(key_of(list, g))
        });
        groups.version += 1;
        (gid, dest)
    }

    /// Installs the aggregations of plan generation `generation` (once, however
    /// many lanes ask): aggregation `i` keeps the groups of the old one
    /// `kept[i]` names, the others start empty; the groups of old aggregations
    /// not kept are given back to `budget`.
    pub fn set_plan(
        &mut self,
        generation: u64,
        aggregations: &[Aggregation],
        kept: &[Option<usize>],
        budget: &Budget,
    ) {
        if self.generation >= generation && generation != 0 {
            return;
        }
        self.generation = generation;
        let mut old: Vec<Option<AggGroups>> = self.aggs.drain(..).map(Some).collect();
        let mut aggs = Vec::with_capacity(aggregations.len());
        for (i, agg) in aggregations.iter().enumerate() {
            let groups = kept[i].and_then(|o| old.get_mut(o)?.take());
            aggs.push(groups.unwrap_or_else(|| AggGroups::new(agg)));
        }
        for gone in old.into_iter().flatten() {
            for group in gone.groups.iter().flatten() {
                budget.give_group(group_bytes(&group.key));
            }
        }
        // Destination ids: the kept groups' (renumbered aggregation), the rest free.
        self.dests.iter_mut().for_each(|d| *d = None);
        for (a, groups) in aggs.iter().enumerate() {
            for (gid, group) in groups.groups.iter().enumerate() {
                if let Some(group) = group {
                    self.dests[group.dest as usize] = Some((a as u16, gid as u32));
                }
            }
            if let Some(d) = groups.overflow_dest {
                self.dests[d as usize] = Some((a as u16, OVERFLOW));
            }
        }
        self.free_dests = (0..self.dests.len() as u32)
            .rev()
            .filter(|&d| self.dests[d as usize].is_none())
            .collect();
        self.aggs = aggs;
    }

    /// Groups of aggregation `agg` that `live` (by group id) does not mark.
    pub fn unused(&self, agg: usize, live: &[bool]) -> usize {
        let groups = &self.aggs[agg];
        groups
            .ids
            .iter()
            .filter(|&&gid| !live.get(gid as usize).copied().unwrap_or(false))
            .count()
    }

    /// Whether reclaiming `unused` groups is worth clearing the series
    /// caches for (see the module doc).
    pub fn worth_reclaiming(&self, unused: usize, budget: &Budget) -> bool {
        let held = budget.held().groups;
        let at_limit = (held as u128) * 4 >= (budget.capacity.groups as u128) * 3;
        unused > 0 && (unused * 16 >= held || at_limit)
    }

    /// Frees every group of aggregation `agg` that `live` does not mark
    /// (their ids and destination ids reused later), giving them back to
    /// `budget`; returns how many.
    pub fn reclaim(&mut self, agg: usize, live: &[bool], budget: &Budget) -> usize {
        let groups = &mut self.aggs[agg];
        let mut freed = Vec::new();
        let list = &groups.groups;
        groups.ids.retain(|&mut gid| {
            let keep = live.get(gid as usize).copied().unwrap_or(false);
            if !keep {
                freed.push(gid);
                budget.give_group(group_bytes(key_of(list, gid)));
            }
            keep
        });
        for &gid in &freed {
            let group = groups.groups[gid as usize]
                .take()
                .expect("a reclaimed id was a group");
            groups.free.push(gid);
            self.dests[group.dest as usize] = None;
            self.free_dests.push(group.dest);
        }
        if !freed.is_empty() {
            groups.version += 1;
            // Lowest ids first, so ids (and pane slots) stay dense.
            groups.free.sort_unstable_by(|a, b| b.cmp(a));
            budget
                .reclaimed
                .fetch_add(freed.len() as u64, Ordering::Relaxed);
        }
        freed.len()
    }
}

/// The budget and the group table, as the lanes of one ingester share them.
#[derive(Debug)]
pub struct Shared {
    pub budget: Budget,
    pub groups: parking_lot::Mutex<GroupTable>,
}

impl Shared {
    pub fn new(capacity: Capacity) -> Self {
        Shared {
            budget: Budget::new(capacity),
            groups: parking_lot::Mutex::new(GroupTable::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::group_key::{parse_group_key, write_group_key};
    use crate::ingest::plan::Plan;

    /// A group's labels, read from its key, are its key's values (unescaped,
    /// empty ones left out) under the group-by names; groups are found by
    /// their keys, also after others were reclaimed and their ids reused.
    #[test]
    fn groups_are_found_by_key_and_labelled_from_it() {
        let mut plan = Plan::load_or_default(None).expect("the feeder's plan");
        plan.aggregations[0].group_by = ["a", "b", "c", "d"].map(String::from).to_vec();
        let budget = Budget::new(Capacity::UNBOUNDED);
        let mut table = GroupTable::default();
        table.set_plan(1, &plan.aggregations, &[None], &budget);
        let tuples: [[&[u8]; 4]; 3] = [
            [b"g0", b"", b"a\"b,c\\d\ne", b"caf\xc3\xa9"],
            [b"", b"", b"", b"x\\"],
            [b"g1", b"1", b"2", b"3"],
        ];
        let keys: Vec<Vec<u8>> = tuples
            .iter()
            .map(|values| {
                let mut key = Vec::new();
                write_group_key(&mut key, values);
                key
            })
            .collect();
        let ids: Vec<u32> = keys.iter().map(|k| table.intern(0, k, &budget).0).collect();
        for (key, &gid) in keys.iter().zip(&ids) {
            assert_eq!(table.intern(0, key, &budget).0, gid, "found again");
            let expected: Vec<(String, String)> = ["a", "b", "c", "d"]
                .iter()
                .zip(parse_group_key(key))
                .filter(|(_, v)| !v.is_empty())
                .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(&v).into_owned()))
                .collect();
            assert_eq!(table.agg(0).labels(gid), expected);
        }
        assert_eq!(table.agg(0).len(), 3);
        // The first group reclaimed; a new one takes its id, the others stay.
        let live: Vec<bool> = ids.iter().map(|&gid| gid != ids[0]).collect();
        assert_eq!(table.reclaim(0, &live, &budget), 1);
        assert_eq!(table.agg(0).find(&keys[0]), None);
        let (reused, _) = table.intern(0, b"\"new\",\"\",\"\",\"\"", &budget);
        assert_eq!(reused, ids[0]);
        assert_eq!(table.agg(0).labels(reused), [("a".into(), "new".into())]);
        for (key, &gid) in keys.iter().zip(&ids).skip(1) {
            assert_eq!(table.agg(0).find(key), Some(gid));
        }
    }
}
