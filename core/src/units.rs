//! Sizes and durations as people write them (`512MiB`, `1.5G`, `30s`) and as
//! people read them (`64 MiB`), and rows of them as a table.

use std::fmt;
use std::time::Duration;

/// Parses a size: `512MiB`, `2GiB`, `1.5G`, `64k`, `1000000` (bytes). A bare
/// `G`, `M` or `K` means the binary unit, as in Slurm's `--mem`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    if num.is_empty() {
        return Err(format!("{s:?} is not a size (try 512MiB, 2GiB, 1.5G)"));
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "unknown size unit {unit:?} in {s:?} (try 512MiB, 2GiB, 1.5G)"
            ));
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 512MiB, 2GiB, 1.5G)"))?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("size {s:?} is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a duration: `30s`, `5m`, `1h 30m`, `250ms`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>()
        && secs.is_finite()
        && secs >= 0.0
    {
        return Ok(Duration::from_secs_f64(secs));
    }
    humantime::parse_duration(t).map_err(|e| format!("{s:?} is not a duration ({e}; try 30s, 5m)"))
}

/// A byte count shown the way people read it: `64 MiB`, `1.5 GiB`, `300 B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (i, (name, size)) in UNITS.into_iter().enumerate() {
            if self.0 >= size {
                let v = self.0 as f64 / size as f64;
                if self.0.is_multiple_of(size) {
                    return write!(f, "{} {name}", self.0 / size);
                }
                let shown = if v >= 100.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                };
                // 4084 MiB is not "4.0 GiB": a size that rounds to a whole
                // number it is not shows in the next unit down.
                if shown.ends_with(".0") && i + 1 < UNITS.len() {
                    continue;
                }
                return write!(f, "{shown} {name}");
            }
        }
        write!(f, "{} B", self.0)
    }
}

/// A size as a flag takes it (parsed by [`parse_size`]) and `--help`
/// shows it (as [`Bytes`]), so that a flag's default is the library's
/// constant: `#[arg(default_value_t = Size(DEFAULT_…))]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl std::str::FromStr for Size {
    type Err = String;

    fn from_str(s: &str) -> Result<Size, String> {
        parse_size(s).map(Size)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Exact, and as people type it (`1GiB`, `1536MiB`): it is parsed back.
        for (name, size) in [
            ("TiB", 1u64 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ] {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{name}", self.0 / size);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// A duration as a flag takes it ([`parse_duration`]) and `--help` shows
/// it (`10m`, `30s`); see [`Size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span(pub Duration);

impl std::str::FromStr for Span {
    type Err = String;

    fn from_str(s: &str) -> Result<Span, String> {
        parse_duration(s).map(Span)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// Rows of cells as left-aligned columns two spaces apart.
pub fn render_table<R: AsRef<[String]>>(rows: &[R]) -> String {
    let columns = rows.first().map_or(0, |r| r.as_ref().len());
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .map(|r| r.as_ref()[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            let cells = r
                .as_ref()
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"));
            cells.collect::<Vec<_>>().join("  ").trim_end().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wall-clock milliseconds since the Unix epoch (0 before it): the time
/// adverts and records carry between machines.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("1 MB").unwrap(), 1_000_000);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn flag_values_show_as_they_parse() {
        for size in [
            1 << 30,
            4 << 30,
            64 << 20,
            256 << 20,
            10 << 30,
            1536 << 20,
            12345,
        ] {
            let shown = Size(size).to_string();
            assert_eq!(shown.parse::<Size>(), Ok(Size(size)), "{shown}");
        }
        assert_eq!(Size(1 << 30).to_string(), "1GiB");
        for secs in [1, 10, 30, 60, 600, 24 * 3600] {
            let shown = Span(Duration::from_secs(secs)).to_string();
            assert_eq!(
                shown.parse::<Span>(),
                Ok(Span(Duration::from_secs(secs))),
                "{shown}"
            );
        }
        assert_eq!(Span(Duration::from_secs(600)).to_string(), "10m");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn display() {
        assert_eq!(Bytes(64 << 20).to_string(), "64 MiB");
        assert_eq!(Bytes(3 << 29).to_string(), "1.5 GiB");
        assert_eq!(Bytes(300).to_string(), "300 B");
        assert_eq!(Bytes(21568 << 10).to_string(), "21.1 MiB");
        assert_eq!(Bytes((4 << 30) - (12 << 20)).to_string(), "4084 MiB");
        assert_eq!(Bytes((2 << 30) + (20 << 20)).to_string(), "2068 MiB");
    }
}
