//! `Key`: the identity of one scope of a derived table.

use std::fmt;
use std::sync::Arc;

/// Marks the encoded (composite or NULL-bearing) form. PostgreSQL text can never hold
/// NUL, and a single-part key that happens to start with it is encoded too, so the
/// representation stays unambiguous for every input.
const MARK: char = '\0';

/// After [`MARK`], marks a fan-out's parent key (`MARK 'f' stage ':' parent`): user keys
/// never take this form (their encoded parts start with `n` or `s`), so a parent key
/// and a view key never share a slot in the scheduler or the acknowledgement tracker.
const STAGE: char = 'f';

/// The identity of one scope of a derived table: the value(s) a rebuild recomputes.
///
/// A key is opaque, cheap to clone (one reference count) and compares by value. Most
/// scopes are one column (`Key::from("dev-1")`); a scope over several columns, or one
/// whose column may be NULL, is built with [`Key::from_parts`].
///
/// ```
/// use freshen::Key;
/// let a = Key::from("dev-1");
/// assert_eq!(a.as_str(), Some("dev-1"));
/// let b = Key::from_parts([Some("eu"), None]);
/// assert_eq!(b.parts().collect::<Vec<_>>(), vec![Some("eu"), None]);
/// assert_eq!(b.to_string(), "(eu, NULL)");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

impl Key {
    /// A key of one non-NULL part.
    pub fn new(text: impl AsRef<str>) -> Key {
        let text = text.as_ref();
        if text.starts_with(MARK) {
            return Key::from_parts([Some(text)]);
        }
        Key(Arc::from(text))
    }

    /// A key of several parts, in scope-column order; `None` is SQL NULL.
    ///
    /// A single non-NULL part gives the same key as [`Key::new`].
    pub fn from_parts<I, S>(parts: I) -> Key
    where
        I: IntoIterator<Item = Option<S>>,
        S: AsRef<str>,
    {
        let mut parts = parts.into_iter();
        let first = parts.next();
        let second = parts.next();
        if let (Some(Some(only)), None) = (&first, &second) {
            let only = only.as_ref();
            if !only.starts_with(MARK) {
                return Key(Arc::from(only));
            }
        }
        let mut enc = String::new();
        enc.push(MARK);
        for part in first.into_iter().chain(second).chain(parts) {
            match part {
                None => enc.push('n'),
                Some(s) => {
                    let s = s.as_ref();
                    enc.push('s');
                    enc.push_str(&s.len().to_string());
                    enc.push(':');
                    enc.push_str(s);
                }
            }
        }
        Key(Arc::from(enc))
    }

    /// The text of a key made of exactly one non-NULL part.
    pub fn as_str(&self) -> Option<&str> {
        if self.0.starts_with(MARK) {
            let mut parts = self.parts();
            match (parts.next(), parts.next()) {
                (Some(Some(only)), None) => Some(only),
                _ => None,
            }
        } else {
            Some(&self.0)
        }
    }

    /// A fan-out's parent key: `parent` in the namespace of fan-out `stage`.
    pub(crate) fn staged(stage: usize, parent: &Key) -> Key {
        Key(Arc::from(format!("{MARK}{STAGE}{stage}:{}", parent.0)))
    }

    /// For a parent key from [`staged`](Self::staged): its fan-out and the text of the
    /// parent key itself.
    fn stage_text(&self) -> Option<(usize, &str)> {
        let rest = self.0.strip_prefix(MARK)?.strip_prefix(STAGE)?;
        let (stage, parent) = rest.split_once(':')?;
        Some((stage.parse().ok()?, parent))
    }

    /// For a parent key from [`staged`](Self::staged): its fan-out and the parent key.
    pub(crate) fn stage(&self) -> Option<(usize, Key)> {
        self.stage_text()
            .map(|(stage, parent)| (stage, Key(Arc::from(parent))))
    }

    /// For a parent key from [`staged`](Self::staged): its fan-out.
    pub(crate) fn stage_index(&self) -> Option<usize> {
        self.stage_text().map(|(stage, _)| stage)
    }

    /// The parts of the key in scope-column order (`None` is SQL NULL).
    pub fn parts(&self) -> Parts<'_> {
        let text: &str = match self.stage_text() {
            Some((_, parent)) => parent,
            None => &self.0,
        };
        match text.strip_prefix(MARK) {
            Some(rest) => Parts(PartsInner::Encoded(rest)),
            None => Parts(PartsInner::One(Some(text))),
        }
    }

    /// Whether the key's text is in the encoded form (several parts, or NULL).
    fn encoded(&self) -> bool {
        match self.stage_text() {
            Some((_, parent)) => parent.starts_with(MARK),
            None => self.0.starts_with(MARK),
        }
    }

    /// How many parts the key has.
    pub fn len(&self) -> usize {
        self.parts().count()
    }

    /// Whether the key has no parts (`Key::from_parts` of nothing).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes this key holds on the heap, reference counts included.
    pub fn heap_size(&self) -> usize {
        2 * std::mem::size_of::<usize>() + self.0.len()
    }

    /// The key's encoded text, byte for byte what equality compares: what the
    /// scheduler's index hashes.
    pub(crate) fn encoded_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Iterator over a key's parts, from [`Key::parts`].
#[derive(Debug, Clone)]
pub struct Parts<'a>(PartsInner<'a>);

#[derive(Debug, Clone)]
enum PartsInner<'a> {
    One(Option<&'a str>),
    Encoded(&'a str),
}

impl<'a> Iterator for Parts<'a> {
    type Item = Option<&'a str>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            PartsInner::One(one) => one.take().map(Some),
            PartsInner::Encoded(rest) => {
                let s: &'a str = rest;
                let tag = s.chars().next()?;
                if tag == 'n' {
                    *rest = &s[1..];
                    return Some(None);
                }
                // 's' LEN ':' TEXT — written only by `from_parts`, so well formed.
                let colon = s.find(':')?;
                let len: usize = s[1..colon].parse().ok()?;
                let text = &s[colon + 1..colon + 1 + len];
                *rest = &s[colon + 1 + len..];
                Some(Some(text))
            }
        }
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Key {
        Key::new(s)
    }
}

impl From<String> for Key {
    fn from(s: String) -> Key {
        if s.starts_with(MARK) {
            return Key::new(&s);
        }
        Key(Arc::from(s))
    }
}

impl From<&String> for Key {
    fn from(s: &String) -> Key {
        Key::new(s)
    }
}

/// A key shown for logs: every text part quoted, so that an empty or blank key part
/// is visible (`""`, `("a", NULL)`). From [`Key::quoted`].
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a>(&'a Key);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = self.0.parts();
        let several = self.0.encoded();
        if let Some((stage, _)) = self.0.stage_text() {
            write!(f, "fan-out {stage} ")?;
        }
        if several {
            f.write_str("(")?;
        }
        for (i, part) in parts.enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match part {
                Some(s) => write!(f, "{s:?}")?,
                None => f.write_str("NULL")?,
            }
        }
        if several {
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl Key {
    /// The key for logs, every part quoted: `"dev-1"`, `""`, `("a", NULL)`.
    pub fn quoted(&self) -> Quoted<'_> {
        Quoted(self)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((stage, _)) = self.stage_text() {
            write!(f, "fan-out {stage} ")?;
        }
        if !self.encoded() {
            return f.write_str(self.as_str().unwrap_or_default());
        }
        f.write_str("(")?;
        for (i, part) in self.parts().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(part.unwrap_or("NULL"))?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(")?;
        for (i, part) in self.parts().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match part {
                Some(s) => write!(f, "{s:?}")?,
                None => f.write_str("NULL")?,
            }
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_part_is_plain_text() {
        let k = Key::from("dev-1");
        assert_eq!(k.as_str(), Some("dev-1"));
        assert_eq!(k.len(), 1);
        assert_eq!(k, Key::from_parts([Some("dev-1")]));
        assert_eq!(k, Key::from(String::from("dev-1")));
        assert_eq!(format!("{k}"), "dev-1");
        assert_eq!(format!("{k:?}"), "Key(\"dev-1\")");
    }

    #[test]
    fn composite_and_null_round_trip() {
        let parts = [Some("a:b"), None, Some(""), Some("s3:xyz"), Some("\0x")];
        let k = Key::from_parts(parts);
        assert_eq!(k.parts().collect::<Vec<_>>(), parts.to_vec());
        assert_eq!(k.as_str(), None);
        assert_eq!(k.len(), 5);
        assert_eq!(k.to_string(), "(a:b, NULL, , s3:xyz, \0x)");
    }

    #[test]
    fn composite_keys_do_not_collide_with_text() {
        let joined = Key::from_parts([Some("a"), Some("b")]);
        assert_ne!(joined, Key::from("ab"));
        assert_ne!(joined, Key::from("(a, b)"));
        let null = Key::from_parts([None::<&str>]);
        assert_eq!(null.as_str(), None);
        assert_eq!(null.parts().collect::<Vec<_>>(), vec![None]);
        assert_ne!(null, Key::from("NULL"));
    }

    #[test]
    fn text_starting_with_the_marker_is_escaped() {
        let k = Key::from("\0n");
        assert_eq!(k.as_str(), Some("\0n"));
        assert_eq!(k.parts().collect::<Vec<_>>(), vec![Some("\0n")]);
        assert_ne!(k, Key::from_parts([None::<&str>]));
        assert_eq!(k, Key::from(String::from("\0n")));
    }

    #[test]
    fn a_parent_key_has_its_own_namespace() {
        for parent in [Key::from("5"), Key::from_parts([Some("a"), None])] {
            let staged = Key::staged(2, &parent);
            assert_ne!(staged, parent);
            assert_ne!(staged, Key::staged(1, &parent));
            assert_eq!(staged.stage(), Some((2, parent.clone())));
            assert_eq!(
                staged.parts().collect::<Vec<_>>(),
                parent.parts().collect::<Vec<_>>()
            );
            assert_eq!(staged.to_string(), format!("fan-out 2 {parent}"));
            assert_eq!(parent.stage(), None);
        }
        assert_eq!(Key::from("\0f1:x").stage(), None, "user text is escaped");
    }

    #[test]
    fn empty_key() {
        let k = Key::from_parts(std::iter::empty::<Option<&str>>());
        assert!(k.is_empty());
        assert_eq!(k.as_str(), None);
    }
}
