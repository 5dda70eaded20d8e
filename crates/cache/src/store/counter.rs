//! The number an incr or decr finds in a stored value, read as memcached reads it.

/// A counter value as memcached reads one (strtoull): leading white space, an optional '+',
/// decimal digits fitting in 64 bits, then the end or white space (what follows is ignored).
pub fn parse_counter(value: &[u8]) -> Option<u64> {
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let mut i = value.iter().take_while(|&&b| is_space(b)).count();
    if value.get(i) == Some(&b'+') {
        i += 1;
    }
    let digits = value[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    if let Some(&next) = value.get(i + digits) {
        if !is_space(next) {
            return None;
        }
    }
    std::str::from_utf8(&value[i..i + digits]).ok()?.parse::<u64>().ok()
}
