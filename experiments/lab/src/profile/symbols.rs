//! Inline frames for `perf script --no-inline` output, from the binaries' DWARF
//! (`debug = "line-tables-only"` keeps which function was inlined where).
//! Release builds inline most of the hot code, so without these a flamegraph
//! shows one wide frame where the work is three calls deep.

use std::collections::HashMap;

/// Looks up, per file and address, the functions inlined at that address.
#[derive(Default)]
pub struct Symbolizer {
    /// Per file perf named: its DWARF, or `None` when it has none (or is no file).
    binaries: HashMap<String, Option<Binary>>,
}

struct Binary {
    loader: addr2line::Loader,
    /// Loadable segments: (file offset, size in the file, virtual address).
    segments: Vec<(u64, u64, u64)>,
    /// (address, is the sample's leaf) → inlined function names, innermost first.
    cache: HashMap<(u64, bool), Vec<String>>,
}

impl Symbolizer {
    /// The functions inlined at `address` (an offset into `file`, as perf
    /// prints it) of `file`, innermost first, not counting the function the
    /// code physically belongs to (perf names that one from the symbol table).
    /// A caller's frame holds the address after its call instruction, so the
    /// address before it is looked up unless `leaf`.
    pub fn inlined(&mut self, file: &str, address: u64, leaf: bool) -> Vec<String> {
        let binary = self
            .binaries
            .entry(file.to_string())
            .or_insert_with(|| Binary::load(file));
        match binary {
            Some(binary) => binary.inlined(address, leaf),
            None => Vec::new(),
        }
    }
}

impl Binary {
    fn load(file: &str) -> Option<Binary> {
        // perf's own names for what is not a file: [kernel.kallsyms], [vdso], [unknown].
        if !file.starts_with('/') {
            return None;
        }
        let data = std::fs::read(file).ok()?;
        let object = object::File::parse(&*data).ok()?;
        use object::{Object, ObjectSegment};
        // Without line tables there is nothing to add (system libraries here).
        object.section_by_name(".debug_line")?;
        let segments = object
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        let loader = addr2line::Loader::new(file).ok()?;
        Some(Binary {
            loader,
            segments,
            cache: HashMap::new(),
        })
    }

    fn inlined(&mut self, address: u64, leaf: bool) -> Vec<String> {
        if let Some(names) = self.cache.get(&(address, leaf)) {
            return names.clone();
        }
        let names = self.lookup(address, leaf).unwrap_or_default();
        self.cache.insert((address, leaf), names.clone());
        names
    }

    fn lookup(&self, offset: u64, leaf: bool) -> Option<Vec<String>> {
        let (start, _, vaddr) = self
            .segments
            .iter()
            .find(|(start, size, _)| (*start..start + size).contains(&offset))?;
        let probe = offset - start + vaddr - u64::from(!leaf && offset > 0);
        let mut frames = self.loader.find_frames(probe).ok()?;
        let mut names = Vec::new();
        while let Ok(Some(frame)) = frames.next() {
            let name = frame
                .function
                .as_ref()
                .and_then(|f| f.demangle().ok())
                .map(|n| without_generic_arguments(&n).to_string())
                .unwrap_or_else(|| "[unknown]".to_string());
            names.push(name);
        }
        // The last frame is the function the code belongs to.
        names.pop();
        Some(names)
    }
}

/// An inlined function's DWARF name without its generic arguments
/// (`extend_from_slice<u8, alloc::alloc::Global>` → `extend_from_slice`):
/// line-tables-only DWARF names a function without its path, and the
/// arguments, often longer than the name, would fill the folded stacks.
/// A name that starts with `<` (`<T as Trait>::f`) is kept whole.
fn without_generic_arguments(name: &str) -> &str {
    match name.find('<') {
        Some(at) if at > 0 => &name[..at],
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address of an instruction in the body of the innermost of two
    /// functions inlined into `outer_marker`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn inner_marker() -> usize {
        let ip: usize;
        // The address of this very instruction (`[rip]` would be the next
        // one's, which may belong to the caller's code).
        // SAFETY: computes an address into a register; no memory touched.
        unsafe { std::arch::asm!("2:", "lea {}, [rip + 2b]", out(reg) ip) };
        ip
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn middle_marker() -> usize {
        std::hint::black_box(inner_marker())
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn outer_marker() -> usize {
        std::hint::black_box(middle_marker())
    }

    /// perf's address for `ip` of this process: the offset into its file.
    fn file_offset(ip: usize) -> (String, u64) {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for line in maps.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (start, end) = fields[0].split_once('-').unwrap();
            let start = usize::from_str_radix(start, 16).unwrap();
            let end = usize::from_str_radix(end, 16).unwrap();
            if (start..end).contains(&ip) {
                let offset = u64::from_str_radix(fields[2], 16).unwrap();
                return (fields[5].to_string(), (ip - start) as u64 + offset);
            }
        }
        panic!("{ip:x} is in no mapping");
    }

    /// The inline frames at an address of this test binary, found from the
    /// address perf would print (a file offset): innermost first, without
    /// the function they were inlined into.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn finds_the_functions_inlined_at_an_address() {
        let (file, offset) = file_offset(outer_marker());
        let mut symbolizer = Symbolizer::default();
        assert_eq!(
            symbolizer.inlined(&file, offset, true),
            ["inner_marker", "middle_marker"]
        );
        // Cached, and the same again.
        assert_eq!(symbolizer.inlined(&file, offset, true).len(), 2);
        // Not a file, or no line tables: nothing to add.
        assert!(symbolizer
            .inlined("[kernel.kallsyms]", offset, true)
            .is_empty());
        assert!(symbolizer.inlined("/nonexistent", offset, true).is_empty());
    }

    #[test]
    fn generic_arguments_go() {
        assert_eq!(
            without_generic_arguments("extend_from_slice<u8, alloc::alloc::Global>"),
            "extend_from_slice"
        );
        assert_eq!(
            without_generic_arguments(
                "{closure#0}<promlab::export::{impl#11}::scrape::{closure_env#0}>"
            ),
            "{closure#0}"
        );
        assert_eq!(
            without_generic_arguments("decode_key_fast"),
            "decode_key_fast"
        );
        assert_eq!(
            without_generic_arguments("<u8 as core::fmt::Debug>::fmt"),
            "<u8 as core::fmt::Debug>::fmt"
        );
    }
}
