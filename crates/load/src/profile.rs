//! A load profile: how many users are active over time, as a step function read from a text
//! file of `seconds users` lines (for linear growth, a hockey stick, a flash crowd, a day).

use std::path::Path;

use anyhow::{bail, Context, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// (seconds from the start of the run, users from then on), strictly increasing times.
    pub points: Vec<(f64, usize)>,
}

impl Profile {
    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the load profile {}", path.display()))?;
        Profile::parse(&text).with_context(|| format!("in the load profile {}", path.display()))
    }

    /// Lines of `seconds users`; `#` starts a comment; the first time must be 0.
    pub fn parse(text: &str) -> Result<Profile> {
        let mut points: Vec<(f64, usize)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut fields = line.split_whitespace();
            let (Some(t), Some(u), None) = (fields.next(), fields.next(), fields.next()) else {
                bail!("line {}: expected `seconds users`, got {line:?}", n + 1);
            };
            let t: f64 = t
                .parse()
                .ok()
                .filter(|t: &f64| t.is_finite() && *t >= 0.0)
                .with_context(|| format!("line {}: {t:?} is not a number of seconds", n + 1))?;
            let u: usize = u.parse().with_context(|| format!("line {}: {u:?} is not a number of users", n + 1))?;
            if let Some(&(last, _)) = points.last() {
                if t <= last {
                    bail!("line {}: times must increase ({t} after {last})", n + 1);
                }
            } else if t != 0.0 {
                bail!("line {}: the first point must be at 0 seconds", n + 1);
            }
            points.push((t, u));
        }
        if points.is_empty() {
            bail!("no points");
        }
        Ok(Profile { points })
    }

    /// A profile from (seconds, users) points already read (e.g. from a fleet file), checked
    /// as [`Profile::parse`] checks lines: the first at 0 seconds, times strictly increasing.
    pub fn from_points(points: Vec<(f64, usize)>) -> Result<Profile> {
        for (i, &(t, _)) in points.iter().enumerate() {
            if !(t.is_finite() && t >= 0.0) {
                bail!("point {i}: {t} is not a number of seconds");
            }
            match i.checked_sub(1).map(|p| points[p].0) {
                None if t != 0.0 => bail!("point 0: the first point must be at 0 seconds, not {t}"),
                Some(last) if t <= last => bail!("point {i}: times must increase ({t} after {last})"),
                _ => {}
            }
        }
        if points.is_empty() {
            bail!("no points");
        }
        Ok(Profile { points })
    }

    pub fn users_at(&self, seconds: f64) -> usize {
        self.points.iter().rev().find(|(t, _)| *t <= seconds).map(|p| p.1).unwrap_or(0)
    }

    pub fn peak(&self) -> usize {
        self.points.iter().map(|p| p.1).max().unwrap_or(0)
    }

    /// User-seconds over [0, end): the integral of the step function.
    pub fn user_seconds(&self, end: f64) -> f64 {
        let mut total = 0.0;
        for (i, (t, u)) in self.points.iter().enumerate() {
            let next = self.points.get(i + 1).map(|p| p.0).unwrap_or(end).min(end);
            if next > *t {
                total += (next - t) * *u as f64;
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        let p = Profile::parse("# flash crowd\n0 10\n60 100   # crowd arrives\n90 10\n").unwrap();
        assert_eq!(p.users_at(0.0), 10);
        assert_eq!(p.users_at(59.9), 10);
        assert_eq!(p.users_at(60.0), 100);
        assert_eq!(p.users_at(1000.0), 10);
        assert_eq!(p.peak(), 100);
        assert_eq!(p.user_seconds(120.0), 60.0 * 10.0 + 30.0 * 100.0 + 30.0 * 10.0);
    }

    #[test]
    fn errors_name_the_line() {
        assert!(Profile::parse("5 10\n").unwrap_err().to_string().contains("first point must be at 0"));
        assert!(Profile::parse("0 10\n0 5\n").unwrap_err().to_string().contains("line 2: times must increase"));
        assert!(Profile::parse("0 ten\n").unwrap_err().to_string().contains("line 1"));
        assert!(Profile::parse("0 1 2\n").unwrap_err().to_string().contains("expected `seconds users`"));
        assert!(Profile::parse("# nothing\n").is_err());
    }

    #[test]
    fn points_are_checked_as_lines_are() {
        assert_eq!(Profile::from_points(vec![(0.0, 1), (41.2, 0)]).unwrap().users_at(50.0), 0);
        assert!(Profile::from_points(vec![(1.0, 1)]).unwrap_err().to_string().contains("first point must be at 0"));
        assert!(Profile::from_points(vec![(0.0, 1), (5.0, 2), (5.0, 0)]).unwrap_err().to_string().contains("point 2: times must increase"));
        assert!(Profile::from_points(vec![(0.0, 1), (f64::NAN, 2)]).is_err());
        assert!(Profile::from_points(vec![]).is_err());
    }
}
