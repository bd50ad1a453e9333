//! The series cache (`series-cache`): a series' raw label bytes → its
//! canonical key and destinations, kept across requests.

use crate::ingest::hashing::network_hasher;

/// `series-cache`: a series' raw label bytes → its canonical key and destinations.
///
/// Entries are numbered in insertion order. Senders repeat their series in the
/// same order request after request, so the entry after the last one found is
/// tried first (one sequential compare); the hash index is the fallback.
pub(super) struct SeriesCache {
    /// Seeded at random, per process and per cache (see [`network_hasher`]).
    hasher: ahash::RandomState,
    /// (hash of the raw label bytes, entry id).
    index: hashbrown::HashTable<(u64, u32)>,
    pub(super) entries: Vec<CacheEntry>,
    /// The raw label bytes of every entry, back to back.
    arena: Vec<u8>,
    /// Destination ids of every entry, back to back (the hot part).
    pub(super) dest_ids: Vec<u32>,
    /// Per destination: its aggregation and where its group key is in
    /// `text` (for the per-sample router).
    dest_keys: Vec<(u16, (u32, u32))>,
    /// Every entry's series key and its destinations' group keys, back to
    /// back (validated labels, so UTF-8): a new series costs no allocation.
    text: Vec<u8>,
    /// Whether entries keep those keys: only the per-sample router reads
    /// them (`batch-routing` reads the destination ids), so a cache without
    /// it neither builds nor stores them.
    keys: bool,
    /// The entry tried first by the next lookup.
    next_guess: u32,
    pub(super) capacity: usize,
    /// Bytes held by the entries (raw labels, keys), and their bound.
    bytes: usize,
    pub(super) max_bytes: usize,
    generation: u64,
    pub(super) hits: u64,
    pub(super) misses: u64,
    pub(super) evicted: u64,
    pub(super) invalidated: u64,
}

/// Bytes of an entry besides its keys (the entry, its index slot, a destination).
const CACHE_ENTRY_OVERHEAD: usize = 64;

pub(super) struct CacheEntry {
    raw: (u32, u32),
    pub(super) dests: (u32, u32),
    /// Where its series key is in `text`.
    series_key: (u32, u32),
}

/// A lookup's miss: the raw labels' hash, for [`SeriesCache::insert`].
pub(super) struct Unseen(u64);

/// Past this many bytes an arena is dropped with the rest (between requests,
/// as when the cache is full), so its `u32` offsets cannot wrap: one request
/// adds at most its decoded size, bounded far below the other half.
const ARENA_LIMIT: usize = (u32::MAX / 2) as usize;

impl SeriesCache {
    pub(super) fn new(capacity: usize, keys: bool) -> Self {
        SeriesCache {
            hasher: network_hasher(),
            index: hashbrown::HashTable::new(),
            entries: Vec::new(),
            arena: Vec::new(),
            dest_ids: Vec::new(),
            dest_keys: Vec::new(),
            text: Vec::new(),
            keys,
            next_guess: 0,
            capacity,
            bytes: 0,
            max_bytes: usize::MAX,
            generation: 0,
            hits: 0,
            misses: 0,
            evicted: 0,
            invalidated: 0,
        }
    }

    /// Drops every entry, counted as invalidated (their destination ids may be reused).
    pub(super) fn invalidate(&mut self) {
        self.invalidated += self.entries.len() as u64;
        self.clear();
    }

    fn clear(&mut self) {
        self.index.clear();
        self.entries.clear();
        self.arena.clear();
        self.dest_ids.clear();
        self.dest_keys.clear();
        self.text.clear();
        self.next_guess = 0;
        self.bytes = 0;
    }

    pub(super) fn check_generation(&mut self, generation: u64) {
        if self.generation != generation {
            self.invalidated += self.entries.len() as u64;
            self.clear();
            self.generation = generation;
        }
    }

    /// Dropping everything at once keeps the bound simple; it happens between
    /// requests only, so entry ids stay valid while a request is routed.
    pub(super) fn evict_if_full(&mut self) {
        if self.entries.len() > self.capacity
            || self.bytes > self.max_bytes
            || self.arena.len().max(self.text.len()) > ARENA_LIMIT
        {
            self.evicted += self.entries.len() as u64;
            self.clear();
        }
    }

    #[inline]
    fn raw_of(&self, id: u32) -> &[u8] {
        let (at, len) = self.entries[id as usize].raw;
        &self.arena[at as usize..(at + len) as usize]
    }

    fn text_at(&self, (at, len): (u32, u32)) -> &str {
        std::str::from_utf8(&self.text[at as usize..(at + len) as usize])
            .expect("keys of validated labels are UTF-8")
    }

    /// Whether entries keep their series and group keys ([`SeriesCache::series_key`],
    /// [`SeriesCache::dest_keys`]).
    pub(super) fn keeps_keys(&self) -> bool {
        self.keys
    }

    /// Entry `id`'s series key (empty when the cache keeps no keys).
    pub(super) fn series_key(&self, id: u32) -> &str {
        self.text_at(self.entries[id as usize].series_key)
    }

    /// Entry `id`'s destinations' aggregations and group keys (none when the
    /// cache keeps no keys).
    pub(super) fn dest_keys(&self, id: u32) -> impl Iterator<Item = (u16, &str)> {
        let (first, n) = self.entries[id as usize].dests;
        self.dest_keys[first as usize..(first + n) as usize]
            .iter()
            .map(|&(agg, key)| (agg, self.text_at(key)))
    }

    /// The entry of `raw`, or its hash to insert it with.
    #[inline]
    pub(super) fn lookup(&mut self, raw: &[u8]) -> Result<u32, Unseen> {
        let guess = self.next_guess;
        let id = if (guess as usize) < self.entries.len() && self.raw_of(guess) == raw {
            guess
        } else {
            self.find(raw)?
        };
        self.hits += 1;
        self.next_guess = id + 1;
        Ok(id)
    }

    /// The hash index, for when the sender's order changed (out of line: the guess is the hot path).
    #[inline(never)]
    fn find(&self, raw: &[u8]) -> Result<u32, Unseen> {
        let hash = self.hasher.hash_one(raw);
        match self
            .index
            .find(hash, |&(h, id)| h == hash && self.raw_of(id) == raw)
        {
            Some(&(_, id)) => Ok(id),
            None => Err(Unseen(hash)),
        }
    }

    /// A series `lookup` did not find: its raw labels, series key and
    /// destinations (id, aggregation, group key); the keys kept only if the
    /// cache keeps keys.
    pub(super) fn insert<'k>(
        &mut self,
        raw: &[u8],
        Unseen(hash): Unseen,
        series_key: &[u8],
        dests: impl IntoIterator<Item = (u32, u16, &'k [u8])>,
    ) -> u32 {
        self.misses += 1;
        let id = self.entries.len() as u32;
        let at = self.arena.len() as u32;
        self.arena.extend_from_slice(raw);
        let first_dest = self.dest_ids.len() as u32;
        let text_before = self.text.len();
        let series_key = self.push_key(series_key);
        for (dest, agg, group_key) in dests {
            self.dest_ids.push(dest);
            if self.keys {
                let key = self.push_key(group_key);
                self.dest_keys.push((agg, key));
            }
        }
        let dests = self.dest_ids.len() - first_dest as usize;
        self.bytes +=
            CACHE_ENTRY_OVERHEAD + raw.len() + (self.text.len() - text_before) + 32 * dests;
        self.entries.push(CacheEntry {
            raw: (at, raw.len() as u32),
            dests: (first_dest, self.dest_ids.len() as u32 - first_dest),
            series_key,
        });
        self.index.insert_unique(hash, (hash, id), |&(h, _)| h);
        self.next_guess = id + 1;
        id
    }

    /// `key` appended to `text` if the cache keeps keys; where it is.
    fn push_key(&mut self, key: &[u8]) -> (u32, u32) {
        if !self.keys {
            return (0, 0);
        }
        let at = self.text.len() as u32;
        self.text.extend_from_slice(key);
        (at, key.len() as u32)
    }
}
