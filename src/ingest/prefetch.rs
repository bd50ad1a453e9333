//! Cache prefetch hints for the hot paths (routing, closing, answering).

/// A hint to bring the cache lines of `*p` (its first 4 KiB) in for
/// reading. Nothing else happens: a prefetch never faults, and other
/// architectures go without.
#[inline(always)]
pub(super) fn prefetch_read<T: ?Sized>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let at: *const i8 = (p as *const T).cast();
        for line in (0..std::mem::size_of_val(p).min(4096)).step_by(64) {
            // SAFETY: a prefetch reads nothing the program sees and never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    at.wrapping_add(line),
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
