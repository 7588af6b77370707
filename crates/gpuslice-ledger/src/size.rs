//! Sizes as people write them (`20GiB`, `1.5GB`).

/// A quantity as people write it (`1.5GB`, `500ms`), trimmed and split
/// into its number (the leading digits and dots) and the unit after it.
pub fn split_unit(text: &str) -> (&str, &str) {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    t.split_at(split)
}

/// Parses `20GiB`, `512MiB`, `1.5GB`, `8G`, `4096` (bytes). Binary units
/// (KiB, MiB, GiB, TiB, and the bare K/M/G/T) are powers of 1024; decimal
/// ones (KB, MB, GB, TB) powers of 1000.
pub fn parse_size(text: &str) -> Option<u64> {
    let (num, unit) = split_unit(text);
    let unit = unit.trim();
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    if !num.contains('.') && mult == 1.0 {
        return num.parse().ok();
    }
    let v: f64 = num.parse().ok()?;
    let bytes = v * mult;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}
