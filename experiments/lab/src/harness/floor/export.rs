//! The export floor ([`ExportFloor`]): every store file's used region read, and the exposition written.

use super::RenderFloor;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;

/// Export: every store file mapped once (as a long-lived exporter keeps
/// them); a scrape checks every byte the exposition depends on and writes the
/// exposition. Each file's `used` and each entry's length and padded key are
/// compared with a copy of what the store held when the floor was built
/// (every distinct entry's bytes once, as an exporter's catalogue keeps its
/// raw keys), each value is read, and the exposition is written as
/// [`RenderFloor`] writes it (text copied, each value formatted: the values
/// read change between scrapes, so no exporter can keep the text whole).
/// What is left out is all an exporter adds to that: walking the entries by
/// their lengths, finding each key's series, folding values and grouping.
///
/// Before all that, a scrape asks once whether the store's listing changed
/// ([`ListingCheck`]): one read of an inotify watch on the directory, which
/// finds no event. No scrape that must see a file created before it began
/// can learn that with less than one syscall.
///
/// Mappings are a per-process resource (`vm.max_map_count`, 65,530 by
/// default) that the arms' exporters in the same process need too, so the
/// floor maps at most a quarter of it ([`map_budget`]); a store with more
/// files (the 50,400 of `many-processes`) has the rest opened and read
/// (`pread` of the used region) on every scrape, which is what a reader that
/// cannot map them does.
pub struct ExportFloor {
    files: Vec<FloorFile>,
    /// Per file: what the floor checks in it.
    plans: Vec<FilePlan>,
    /// Every file's entries, file after file (one buffer, read front to
    /// back: a vector per file was a cache miss per file on a cold scrape,
    /// which a scrape by promlab's plan, one buffer too, did not pay).
    entries: Vec<FloorEntry>,
    distinct: Vec<u8>,
    /// Writes the exposition, each value formatted.
    render: RenderFloor,
    /// The used region of a file read, not mapped.
    read: Vec<u8>,
    /// Whether the directory's listing changed: once per scrape.
    listing: ListingCheck,
    /// The floor's maps, set aside in the exporters' map budget.
    _reserved: promlab::export::MapReservation,
}

/// How the floor reaches a store file's bytes.
enum FloorFile {
    Mapped(memmap2::Mmap),
    /// Past the map budget: opened and its used region read, per scrape.
    Read(std::path::PathBuf),
}

/// How many store files the export floor keeps mapped: a quarter of
/// `vm.max_map_count` (16,382 at Linux's default).
pub fn map_budget() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(16_382, |max| max / 4)
}

/// One store file as the floor built: its header's `used`, and where its
/// entries are in `ExportFloor::entries`.
struct FilePlan {
    used: i32,
    entries: std::ops::Range<usize>,
}

/// One entry: where its length starts in the file, where its bytes (length
/// and padded key) start in `ExportFloor::distinct`, and how many there are.
struct FloorEntry {
    at: u32,
    start: u32,
    len: u32,
}

impl ExportFloor {
    /// The store in `dir` and the exposition it must give (already verified).
    pub fn new(dir: &Path, exposition: Vec<u8>) -> Result<ExportFloor> {
        ExportFloor::with_map_budget(dir, exposition, map_budget())
    }

    /// [`ExportFloor::new`], keeping at most `max_mapped` files mapped (an
    /// arm's exporter beside it keeps as many: like with like).
    pub fn with_map_budget(
        dir: &Path,
        exposition: Vec<u8>,
        max_mapped: usize,
    ) -> Result<ExportFloor> {
        let mut paths: Vec<_> = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        paths.sort();
        let files_to_map = paths.len().min(max_mapped);
        // The floor's maps come out of the exporters' budget (the process's
        // map table is one), or the arms' kept maps and these together would
        // exhaust it and the next allocation would fail.
        let reserved = promlab::export::reserve_maps(files_to_map);
        let budget = files_to_map;
        let mut files = Vec::new();
        let mut plans = Vec::new();
        let mut entries = Vec::new();
        let mut distinct = Vec::new();
        let mut starts: HashMap<Vec<u8>, usize> = HashMap::new();
        for path in paths.iter().filter(|p| p.is_file()) {
            let file = std::fs::File::open(path)?;
            // SAFETY: the store is not written while the floor reads it (a
            // benchmark's store is written once, before any arm runs).
            let map = unsafe { memmap2::Mmap::map(&file) }
                .with_context(|| format!("cannot map {}", path.display()))?;
            let used = used_region(&map).len();
            let header = header(&map);
            let first = entries.len();
            for entry in promlab::format::storefile::entries(&map, used) {
                let entry = entry.with_context(|| format!("{}", path.display()))?;
                let at = entry.value_offset - entry.padded_key.len() - 4;
                let bytes = &map[at..entry.value_offset];
                let start = *starts.entry(bytes.to_vec()).or_insert_with(|| {
                    distinct.extend_from_slice(bytes);
                    distinct.len() - bytes.len()
                });
                entries.push(FloorEntry {
                    at: u32::try_from(at)?,
                    start: u32::try_from(start)?,
                    len: u32::try_from(bytes.len())?,
                });
            }
            plans.push(FilePlan {
                used: header,
                entries: first..entries.len(),
            });
            files.push(if files.len() < budget {
                FloorFile::Mapped(map)
            } else {
                FloorFile::Read(path.clone())
            });
        }
        Ok(ExportFloor {
            files,
            plans,
            entries,
            distinct,
            render: RenderFloor::new(&exposition),
            read: Vec::new(),
            listing: ListingCheck::new(dir)?,
            _reserved: reserved,
        })
    }

    /// Bytes of store the floor reads per scrape (the used regions).
    pub fn store_bytes(&self) -> usize {
        self.plans.iter().map(|p| p.used.max(0) as usize).sum()
    }

    /// The exposition's lines.
    pub fn lines(&self) -> u64 {
        self.render.lines()
    }

    /// Whether [`ExportFloor::run`] writes the exposition's bytes (every
    /// value's shortest form is the one it prints; Ruby's `1.0e-05` is not).
    pub fn same_bytes(&self) -> bool {
        self.render.same_bytes
    }

    /// One scrape; fails if the store changed since the floor was built.
    pub fn run(&mut self) -> Result<&[u8]> {
        self.check()?;
        Ok(self.render.run())
    }

    /// Every file's `used` and entries compared, every value read.
    fn check(&mut self) -> Result<()> {
        self.listing.check()?;
        let mut sum = 0.0f64;
        let mut guarded = promlab::shared::mapguard::GuardedReads::default();
        for (file, plan) in self.files.iter().zip(&self.plans) {
            let entries = &self.entries[plan.entries.clone()];
            let checked = match file {
                // A mapping of a file another process may shrink is read
                // under a `SIGBUS` guard, as every exporter's is: without
                // one a truncated file kills the scrape's process.
                FloorFile::Mapped(map) => guarded
                    .read(map, |bytes| {
                        check_file(bytes, plan.used, entries, &self.distinct)
                    })
                    .unwrap_or(Err("a store file shrank under the floor")),
                FloorFile::Read(path) => {
                    use std::os::unix::fs::FileExt;
                    let used = plan.used.max(MIN_USED) as usize;
                    self.read.resize(used, 0);
                    std::fs::File::open(path)?.read_exact_at(&mut self.read, 0)?;
                    check_file(&self.read, plan.used, entries, &self.distinct)
                }
            };
            match checked {
                Ok(values) => sum += values,
                Err(change) => bail!(change),
            }
        }
        black_box(sum);
        Ok(())
    }

    /// [`ExportFloor::run`] into `out` (see [`RenderFloor::run_into`]).
    pub fn run_into(&mut self, out: &mut Vec<u8>) -> Result<()> {
        self.check()?;
        self.render.run_into(out);
        Ok(())
    }
}

/// One store file's `used` and entries compared with the floor's copy: the
/// sum of its values (each value read), or what differs.
#[inline(always)]
fn check_file(
    bytes: &[u8],
    used: i32,
    entries: &[FloorEntry],
    distinct: &[u8],
) -> Result<f64, &'static str> {
    if header(bytes) != used {
        return Err("a store file's used size changed under the floor");
    }
    let mut sum = 0.0;
    for entry in entries {
        let (at, start, len) = (entry.at as usize, entry.start as usize, entry.len as usize);
        if bytes[at..at + len] != distinct[start..start + len] {
            return Err("a store entry changed under the floor");
        }
        let value = &bytes[at + len..at + len + 8];
        sum += f64::from_le_bytes(value.try_into().expect("8 bytes"));
    }
    Ok(sum)
}

/// The one syscall a scrape cannot do without: whether the store's listing
/// changed since the floor was built, asked of the exporters' own inotify
/// watch ([`StoreWatch`]): every exporter reads its watch to learn that no
/// file came or went, and a cold syscall is several microseconds, a share of
/// a folded store's scrape no floor may leave out. Where no watch
/// can be had (inotify's per-user limits, a network filesystem), an `fstat`
/// of the directory stands in: the same one syscall, though a directory's
/// times cannot tell every change.
///
/// [`StoreWatch`]: promlab::export::StoreWatch
enum ListingCheck {
    Watch(promlab::export::StoreWatch),
    Stat(std::fs::File),
}

impl ListingCheck {
    fn new(dir: &Path) -> Result<ListingCheck> {
        if let Ok(watch) = promlab::export::StoreWatch::new(dir) {
            return Ok(ListingCheck::Watch(watch));
        }
        let dir =
            std::fs::File::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
        Ok(ListingCheck::Stat(dir))
    }

    /// Fails if a file came, went or was written and closed in the store.
    fn check(&mut self) -> Result<()> {
        match self {
            ListingCheck::Watch(watch) => {
                if watch
                    .changed()
                    .context("reading the floor's watch of the store")?
                {
                    bail!("the store's listing changed under the floor");
                }
            }
            ListingCheck::Stat(dir) => {
                black_box(dir.metadata()?);
            }
        }
        Ok(())
    }
}

/// The bytes a file read, not mapped, must have: its header.
const MIN_USED: i32 = 4;

/// A store file's `used` as its first 4 bytes say (0 when it has none).
fn header(map: &[u8]) -> i32 {
    map.get(..4)
        .map_or(0, |b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// A store file's used region.
fn used_region(map: &[u8]) -> &[u8] {
    &map[..(header(map).max(0) as usize).min(map.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_floor_compares_every_key_and_fails_on_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let entries: [(&[u8], f64); 2] = [(b"a=1", 1.0), (b"a=22", 2.0)];
        let bytes = promlab::format::storefile::file_bytes(entries);
        for pid in [1, 2] {
            std::fs::write(dir.path().join(format!("metric_x___{pid}.bin")), &bytes).unwrap();
        }
        let mut floor = ExportFloor::new(dir.path(), b"x 3.0\n".to_vec()).unwrap();
        assert_eq!(floor.run().unwrap(), b"x 3.0\n");
        // Both files' entries are the same: kept once, without their values.
        assert_eq!(floor.distinct.len(), bytes.len() - 8 - 2 * 16);
        let mut changed = bytes.clone();
        let at = changed.windows(4).position(|w| w == b"a=22").unwrap();
        changed[at + 3] = b'3';
        std::fs::write(dir.path().join("metric_x___2.bin"), &changed).unwrap();
        // The write closed is a change to the listing's watch; that event
        // read, the next scrape finds the bytes changed.
        let listing = floor.run().unwrap_err().to_string();
        assert!(listing.contains("listing changed"), "{listing}");
        let entry = floor.run().unwrap_err().to_string();
        assert!(entry.contains("entry changed"), "{entry}");
        assert_eq!(used_region(&[5, 0, 0, 0, 9, 9, 9]), &[5, 0, 0, 0, 9]);
    }

    #[test]
    fn export_floor_reads_its_watch_once_a_scrape_and_fails_on_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = promlab::format::storefile::file_bytes([(b"a=1".as_slice(), 1.0)]);
        std::fs::write(dir.path().join("metric_x___1.bin"), &bytes).unwrap();
        let mut floor = ExportFloor::new(dir.path(), b"x 1.0\n".to_vec()).unwrap();
        assert!(matches!(floor.listing, ListingCheck::Watch(_)));
        assert_eq!(floor.run().unwrap(), b"x 1.0\n");
        assert_eq!(floor.run().unwrap(), b"x 1.0\n");
        std::fs::File::create(dir.path().join("metric_x___2.bin")).unwrap();
        let err = floor.run().unwrap_err().to_string();
        assert!(err.contains("listing changed"), "{err}");
    }
}
