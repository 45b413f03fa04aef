//! Lorem Ipsum, generated locally from a small fixed corpus and a caller's
//! RNG, so a seeded round writes the same text every time.

use rand::Rng;

/// The classic opening every text starts with.
const OPENING: &str = "Lorem ipsum dolor sit amet, consectetur adipiscing elit.";

/// The words sentences are drawn from.
const WORDS: &[&str] = &[
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "et",
    "dolore",
    "magna",
    "aliqua",
    "enim",
    "ad",
    "minim",
    "veniam",
    "quis",
    "nostrud",
    "exercitation",
    "ullamco",
    "laboris",
    "nisi",
    "aliquip",
    "ex",
    "ea",
    "commodo",
    "consequat",
    "duis",
    "aute",
    "irure",
    "in",
    "reprehenderit",
    "voluptate",
    "velit",
    "esse",
    "cillum",
    "fugiat",
    "nulla",
    "pariatur",
    "excepteur",
    "sint",
    "occaecat",
    "cupidatat",
    "non",
    "proident",
    "sunt",
    "culpa",
    "qui",
    "officia",
    "deserunt",
    "mollit",
    "anim",
    "id",
    "est",
    "laborum",
];

/// One sentence: 6 to 12 words, capitalized, ending with a full stop.
fn sentence(rng: &mut impl Rng) -> String {
    let count = rng.random_range(6..=12);
    let mut s = String::new();
    for i in 0..count {
        let word = WORDS[rng.random_range(0..WORDS.len())];
        if i == 0 {
            let mut chars = word.chars();
            if let Some(first) = chars.next() {
                s.extend(first.to_uppercase());
                s.push_str(chars.as_str());
            }
        } else {
            s.push(' ');
            s.push_str(word);
        }
    }
    s.push('.');
    s
}

/// One paragraph: 4 to 7 sentences.
fn paragraph(rng: &mut impl Rng) -> String {
    let count = rng.random_range(4..=7);
    (0..count)
        .map(|_| sentence(rng))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One or two paragraphs of Lorem Ipsum, starting with the classic opening,
/// cut at a word boundary to at most `max_bytes` (but never shorter than
/// the opening).
pub fn text(rng: &mut impl Rng, max_bytes: usize) -> String {
    let paragraphs = rng.random_range(1..=2);
    let mut out = OPENING.to_string();
    for i in 0..paragraphs {
        out.push_str(if i == 0 { " " } else { "\n\n" });
        out.push_str(&paragraph(rng));
    }
    if out.len() > max_bytes.max(OPENING.len()) {
        // ASCII only: any byte index is a char boundary.
        let cut = out[..max_bytes.max(OPENING.len())]
            .rfind(' ')
            .unwrap_or(OPENING.len());
        out.truncate(cut.max(OPENING.len()));
        if !out.ends_with('.') {
            out.push('.');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn same_seed_same_text() {
        let a = text(&mut StdRng::seed_from_u64(7), 10_000);
        let b = text(&mut StdRng::seed_from_u64(7), 10_000);
        let c = text(&mut StdRng::seed_from_u64(8), 10_000);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.starts_with("Lorem ipsum dolor sit amet"), "{a}");
        assert!(a.ends_with('.'));
        assert!(a.is_ascii());
    }

    #[test]
    fn text_respects_the_budget() {
        let mut rng = StdRng::seed_from_u64(1);
        for budget in [0, 10, 60, 100, 300] {
            let t = text(&mut rng, budget);
            assert!(t.len() <= budget.max(OPENING.len()) + 1, "{budget}: {t}");
            assert!(t.starts_with("Lorem ipsum"));
        }
    }
}
