//! Exact short sleeps: the MPI transport's naps and synthetic stages' durations.

/// Linux lets a sleeping thread oversleep by its timer slack (50 us by default); set it to
/// 1 ns once per thread so synthetic durations are exact.
pub fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    {
        thread_local!(static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
        DONE.with(|done| {
            if !done.replace(true) {
                // SAFETY: PR_SET_TIMERSLACK takes one integer and changes only this thread.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
            }
        });
    }
}
