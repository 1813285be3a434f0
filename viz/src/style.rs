//! Colours, shading, number formatting and axis ticks shared by every chart.

use pipewright_schedule::ActionKind;

/// An sRGB colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    pub const WHITE: Rgb = Rgb(255, 255, 255);
    pub const TEXT: Rgb = Rgb(34, 34, 34);
    pub const MUTED: Rgb = Rgb(100, 100, 100);
    pub const FRAME: Rgb = Rgb(190, 190, 190);
    pub const GRID: Rgb = Rgb(232, 232, 232);
    pub const CAP: Rgb = Rgb(200, 30, 30);

    /// Blend toward white by `t` in `[0, 1]`.
    pub fn tint(self, t: f64) -> Rgb {
        let t = t.clamp(0.0, 1.0);
        let mix = |c: u8| (f64::from(c) + (255.0 - f64::from(c)) * t).round() as u8;
        Rgb(mix(self.0), mix(self.1), mix(self.2))
    }

    /// Text colour that reads on this fill: dark on light fills, white on dark ones.
    pub fn ink(self) -> Rgb {
        // Rec. 709 luma on sRGB values is close enough to pick between two inks.
        let l =
            0.2126 * f64::from(self.0) + 0.7152 * f64::from(self.1) + 0.0722 * f64::from(self.2);
        if l > 150.0 {
            Rgb::TEXT
        } else {
            Rgb::WHITE
        }
    }

    /// `#rrggbb`.
    pub fn hex(self) -> String {
        format!("#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

/// Base colour of an action kind. F, B, I and W are four well-separated hues (Tableau 10);
/// sends and receives are greys so that the comm lane never competes with compute.
pub(crate) fn kind_color(kind: ActionKind) -> Rgb {
    match kind {
        ActionKind::F => Rgb(0x4e, 0x79, 0xa7),
        ActionKind::B => Rgb(0x59, 0xa1, 0x4f),
        ActionKind::I => Rgb(0xf2, 0x8e, 0x2b),
        ActionKind::W => Rgb(0xb0, 0x7a, 0xa1),
        ActionKind::R => Rgb(0xed, 0xc9, 0x48),
        ActionKind::Overlap { .. } => Rgb(0x76, 0xb7, 0xb2),
        ActionKind::SendF | ActionKind::SendB => Rgb(0x6b, 0x6b, 0x6b),
        ActionKind::RecvF | ActionKind::RecvB => Rgb(0xb0, 0xb0, 0xb0),
    }
}

/// Human name of a kind for legends.
pub(crate) fn kind_name(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::F => "forward",
        ActionKind::B => "backward",
        ActionKind::I => "backward input",
        ActionKind::W => "backward weight",
        ActionKind::R => "recompute",
        ActionKind::Overlap { .. } => "forward+backward",
        ActionKind::SendF | ActionKind::SendB => "send",
        ActionKind::RecvF | ActionKind::RecvB => "recv",
    }
}

/// How much lighter chunk `chunk` of `chunks` is drawn: chunk 0 at full strength, the last
/// chunk at 55% toward white, so chunks differ but the hue (the kind) stays recognisable.
pub(crate) fn chunk_tint(chunk: u32, chunks: u32) -> f64 {
    if chunks <= 1 {
        0.0
    } else {
        0.55 * f64::from(chunk.min(chunks - 1)) / f64::from(chunks - 1)
    }
}

/// Fill of one action: its kind's colour shaded by its model chunk.
pub(crate) fn action_fill(kind: ActionKind, chunk: u32, chunks: u32) -> Rgb {
    if kind.is_compute() {
        kind_color(kind).tint(chunk_tint(chunk, chunks))
    } else {
        kind_color(kind)
    }
}

/// Distinct line colours for per-device and per-series lines (Tableau 10, darker first).
pub(crate) fn series_color(i: usize) -> Rgb {
    const PALETTE: [Rgb; 10] = [
        Rgb(0x1f, 0x77, 0xb4),
        Rgb(0xd6, 0x27, 0x28),
        Rgb(0x2c, 0xa0, 0x2c),
        Rgb(0xff, 0x7f, 0x0e),
        Rgb(0x94, 0x67, 0xbd),
        Rgb(0x8c, 0x56, 0x4b),
        Rgb(0xe3, 0x77, 0xc2),
        Rgb(0x7f, 0x7f, 0x7f),
        Rgb(0xbc, 0xbd, 0x22),
        Rgb(0x17, 0xbe, 0xcf),
    ];
    PALETTE[i % PALETTE.len()]
}

/// `1.5 KiB`, `3.0 MiB`, … (binary units, one decimal; whole bytes below 1 KiB).
pub(crate) fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes.max(0.0);
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A number for an axis label: no trailing zeros, no exponent for everyday magnitudes.
pub(crate) fn format_number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e7).contains(&a) {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Round tick positions (1, 2 or 5 times a power of ten) covering `[lo, hi]`, about
/// `target` of them. Never empty for a finite range; `[lo]` when the range is empty.
pub(crate) fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let span = hi - lo;
    if !span.is_finite() || span <= 0.0 {
        return vec![lo];
    }
    let raw = span / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|f| f * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Tick positions for a byte axis `[0, max]`: round numbers in the binary unit that suits
/// `max` (`0, 16 MiB, 32 MiB`, not `0, 19.1 MiB`).
pub(crate) fn byte_ticks(max: f64, target: usize) -> Vec<f64> {
    let mut unit = 1.0;
    while max / unit >= 1024.0 && unit < 1024f64.powi(5) {
        unit *= 1024.0;
    }
    nice_ticks(0.0, max / unit, target)
        .into_iter()
        .map(|t| t * unit)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(
            nice_ticks(0.0, 10.0, 5),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(nice_ticks(0.0, 0.0, 5), vec![0.0]);
        let t = nice_ticks(0.0, 123_456.0, 8);
        assert!(t.len() >= 5 && t.len() <= 14, "{t:?}");
    }

    #[test]
    fn byte_ticks_are_round_in_binary_units() {
        let mib = 1024.0 * 1024.0;
        let t = byte_ticks(70.0 * mib, 4);
        assert_eq!(t, vec![0.0, 20.0 * mib, 40.0 * mib, 60.0 * mib]);
        assert_eq!(format_bytes(t[1]), "20.0 MiB");
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(format_bytes(512.0), "512 B");
        assert_eq!(format_bytes(1536.0), "1.5 KiB");
        assert_eq!(format_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
    }

    #[test]
    fn numbers_drop_trailing_zeros() {
        assert_eq!(format_number(2.0), "2");
        assert_eq!(format_number(2.5), "2.5");
        assert_eq!(format_number(0.125), "0.125");
    }

    #[test]
    fn chunks_shade_lighter_but_keep_kinds_apart() {
        let f0 = action_fill(ActionKind::F, 0, 2);
        let f1 = action_fill(ActionKind::F, 1, 2);
        assert_ne!(f0, f1);
        assert_ne!(f1, action_fill(ActionKind::B, 1, 2));
        assert_eq!(f0.ink(), Rgb::WHITE);
    }
}
