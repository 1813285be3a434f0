//! Terminal rendering.
use pipewright_schedule::Timeline;
/// stub
pub fn terminal_chart(_tl: &Timeline, _columns: usize) -> String {
    String::new()
}
