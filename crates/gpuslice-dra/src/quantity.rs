//! Kubernetes resource quantities (`20Gi`, `30`, `1.5G`, `20e9`) as
//! integers, for the capacities a claim consumed.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("quantity {text:?}: {why} (e.g. 20Gi, 512Mi, 30)")]
pub struct QuantityError {
    pub text: String,
    pub why: &'static str,
}

const SUFFIXES: &[(&str, u128, u128)] = &[
    // (suffix, multiplier, divisor)
    ("Ki", 1 << 10, 1),
    ("Mi", 1 << 20, 1),
    ("Gi", 1 << 30, 1),
    ("Ti", 1 << 40, 1),
    ("Pi", 1 << 50, 1),
    ("Ei", 1 << 60, 1),
    ("m", 1, 1000),
    ("k", 1_000, 1),
    ("M", 1_000_000, 1),
    ("G", 1_000_000_000, 1),
    ("T", 1_000_000_000_000, 1),
    ("P", 1_000_000_000_000_000, 1),
    ("E", 1_000_000_000_000_000_000, 1),
];

/// The exact integer value of a quantity; a fractional value is an error
/// (a capacity of half a byte or half a percent is not one we can cap).
pub fn parse_integer(text: &str) -> Result<u64, QuantityError> {
    let err = |why| QuantityError {
        text: text.to_string(),
        why,
    };
    let t = text.trim();
    let (num, mul, div) = match decimal_exponent(t) {
        Some((n, e)) if e >= 0 => (n, 10u128.pow(e as u32), 1),
        Some((n, e)) => (n, 1, 10u128.pow(e.unsigned_abs())),
        None => SUFFIXES
            .iter()
            .find_map(|(s, m, d)| t.strip_suffix(s).map(|n| (n, *m, *d)))
            .unwrap_or((t, 1, 1)),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() && frac.is_empty() || !digits_ok(int) || !digits_ok(frac) {
        return Err(err("not a non-negative number with an optional suffix"));
    }
    if frac.len() > 18 || int.len() > 20 {
        return Err(err("too many digits"));
    }
    let scale = 10u128.pow(frac.len() as u32);
    let mantissa: u128 = format!("{int}{frac}")
        .parse()
        .map_err(|_| err("not a number"))?;
    let num = mantissa.checked_mul(mul).ok_or_else(|| err("too large"))?;
    let den = scale * div;
    if num % den != 0 {
        return Err(err("not a whole number"));
    }
    u64::try_from(num / den).map_err(|_| err("too large"))
}

/// `<number>e<exponent>` / `<number>E<exponent>` (a quantity's decimal
/// exponent form, `20e9`, `3E-1`), the exponent at most 18 either way.
fn decimal_exponent(t: &str) -> Option<(&str, i32)> {
    let at = t.find(['e', 'E'])?;
    let (num, exp) = (&t[..at], &t[at + 1..]);
    let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
    if num.is_empty() || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let e: i32 = exp.parse().ok()?;
    (-18..=18).contains(&e).then_some((num, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_decimal_and_plain() {
        assert_eq!(parse_integer("20Gi"), Ok(20 << 30));
        assert_eq!(parse_integer("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_integer("512Mi"), Ok(512 << 20));
        assert_eq!(parse_integer("30"), Ok(30));
        assert_eq!(parse_integer("2G"), Ok(2_000_000_000));
        assert_eq!(parse_integer("30000m"), Ok(30));
        assert_eq!(parse_integer("20e9"), Ok(20_000_000_000));
        assert_eq!(parse_integer("3E1"), Ok(30));
        assert_eq!(parse_integer("300e-1"), Ok(30));
        assert_eq!(parse_integer("1.5e3"), Ok(1500));
    }

    #[test]
    fn refuses_what_is_not_a_whole_non_negative_number() {
        for bad in [
            "",
            "-1",
            "1.5",
            "abc",
            "20GiB",
            "1m",
            "0.5",
            "99999999999999999999Ei",
            "3e-1",
            "1e",
            "e3",
            "1e+",
            "1e99",
            "1E3Gi",
        ] {
            assert!(parse_integer(bad).is_err(), "{bad:?} accepted");
        }
    }
}
