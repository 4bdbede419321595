//! "Did you mean": the closest of some names to a misspelt one.

/// The closest of `candidates` to `name` (for "did you mean"), if any is close.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (distance(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_you_mean() {
        let cols = ["id", "account_id", "plan_id", "seats"];
        assert_eq!(closest("acount_id", cols), Some("account_id"));
        assert_eq!(closest("seat", cols), Some("seats"));
        assert_eq!(closest("plan_di", cols), Some("plan_id"));
        assert_eq!(closest("zzzzzz", cols), None);
    }
}
