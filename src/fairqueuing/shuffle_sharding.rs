//! Shuffle sharding: the Dealer that maps a flow hash to a "hand" of distinct queue indices
//! ("cards") out of a "deck" of queues, exactly as upstream's
//! `pkg/util/shufflesharding/shufflesharding.go` (`NewDealer`, `Deal`, `DealIntoHand`).
//!
//! Only the low `MAX_HASH_BITS` bits worth of entropy are used (the deck/hand validation makes
//! sure `ceil(log2(deck) * hand) <= 60`), so at most 15 cards are ever dealt; dealing needs no
//! heap allocation.

/// Upstream `MaxHashBits`.
pub const MAX_HASH_BITS: i32 = 60;

/// Largest possible hand size given the constraints (upstream's fixed remainder array size).
pub const MAX_HAND: usize = 15;

/// Upstream `RequiredEntropyBits`: `ceil(log2(deck) * hand)` computed in float64.
pub fn required_entropy_bits(deck_size: i32, hand_size: i32) -> i32 {
    let v = ((deck_size as f64).log2() * hand_size as f64).ceil();
    // `as` saturates for out-of-range floats.
    if v.is_nan() {
        i32::MIN
    } else {
        v as i32
    }
}

/// Why a (deck size, hand size) pair is refused, with upstream's messages (`NewDealer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DealerError {
    NotPositive { deck_size: i32, hand_size: i32 },
    HandAboveDeck { deck_size: i32, hand_size: i32 },
    DeckTooLarge { deck_size: i32 },
    TooMuchEntropy { deck_size: i32, hand_size: i32 },
}

impl std::fmt::Display for DealerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            DealerError::NotPositive { deck_size, hand_size } => write!(f, "deckSize {deck_size} or handSize {hand_size} is not positive"),
            DealerError::HandAboveDeck { deck_size, hand_size } => write!(f, "handSize {hand_size} is greater than deckSize {deck_size}"),
            DealerError::DeckTooLarge { deck_size } => write!(f, "deckSize {deck_size} is impractically large"),
            DealerError::TooMuchEntropy { deck_size, hand_size } => {
                write!(f, "required entropy bits of deckSize {deck_size} and handSize {hand_size} is greater than {MAX_HASH_BITS}")
            }
        }
    }
}

impl std::error::Error for DealerError {}

/// A validated (deck size, hand size) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dealer {
    deck: u32,
    hand: u32,
}

impl Dealer {
    /// Upstream `NewDealer`, with its exact error messages.
    pub fn new(deck_size: i32, hand_size: i32) -> Result<Dealer, DealerError> {
        if deck_size <= 0 || hand_size <= 0 {
            return Err(DealerError::NotPositive { deck_size, hand_size });
        }
        if hand_size > deck_size {
            return Err(DealerError::HandAboveDeck { deck_size, hand_size });
        }
        if deck_size > 1 << 26 {
            return Err(DealerError::DeckTooLarge { deck_size });
        }
        if required_entropy_bits(deck_size, hand_size) > MAX_HASH_BITS {
            return Err(DealerError::TooMuchEntropy { deck_size, hand_size });
        }
        Ok(Dealer { deck: deck_size as u32, hand: hand_size as u32 })
    }

    /// Upstream `Deal`: the hand as a fixed array plus its length (no heap allocation).
    pub fn deal_array(&self, mut hash: u64) -> ([u32; MAX_HAND], usize) {
        let mut cards = [0u32; MAX_HAND];
        let n = (self.hand as usize).min(MAX_HAND);
        for (i, r) in cards.iter_mut().enumerate().take(n) {
            let d = (self.deck as u64).saturating_sub(i as u64).max(1);
            *r = (hash % d) as u32;
            hash /= d;
        }
        // Each remainder skips the cards before it (from the last: those are still remainders).
        for i in (0..n).rev() {
            if let Some((earlier, [card, ..])) = cards.split_at_mut_checked(i) {
                *card = earlier.iter().rev().fold(*card, |c, &e| if c >= e { c + 1 } else { c });
            }
        }
        (cards, n)
    }

    /// Upstream `DealIntoHand`: replaces the contents of `hand` with the dealt cards.
    pub fn deal_into_hand(&self, hash: u64, hand: &mut Vec<u32>) {
        hand.clear();
        let (cards, n) = self.deal_array(hash);
        hand.extend_from_slice(cards.get(..n).unwrap_or(&[]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn required_entropy_bits_vectors() {
        assert_eq!(required_entropy_bits(1024, 6), 60);
        assert_eq!(required_entropy_bits(512, 8), 72);
        assert_eq!(required_entropy_bits(64, 6), 36);
        assert_eq!(required_entropy_bits(128, 6), 42);
        assert_eq!(required_entropy_bits(16, 4), 16);
        assert_eq!(required_entropy_bits(128, 8), 56);
        assert_eq!(required_entropy_bits(256, 7), 56);
        assert_eq!(required_entropy_bits(512, 6), 54);
        assert_eq!(required_entropy_bits(1024, 7), 70);
    }

    #[test]
    fn new_dealer_vectors() {
        assert_eq!(Dealer::new(512, 8).unwrap_err().to_string(), "required entropy bits of deckSize 512 and handSize 8 is greater than 60");
        assert!(Dealer::new(1024, 6).is_ok());
        assert_eq!(Dealer::new(1 << 27, 2).unwrap_err().to_string(), "deckSize 134217728 is impractically large");
        assert_eq!(Dealer::new(-100, 8).unwrap_err().to_string(), "deckSize -100 or handSize 8 is not positive");
        assert_eq!(Dealer::new(100, 0).unwrap_err().to_string(), "deckSize 100 or handSize 0 is not positive");
        assert_eq!(Dealer::new(100, 101).unwrap_err().to_string(), "handSize 101 is greater than deckSize 100");
        assert!(Dealer::new(16, 15).is_ok());
        assert!(Dealer::new(17, 15).is_err());
        assert!(Dealer::new(17, 14).is_ok());
        assert!(Dealer::new(1, 1).is_ok());
    }

    fn hand(deck: i32, h: i32, hash: u64) -> Vec<u32> {
        let d = Dealer::new(deck, h).unwrap();
        let mut v = Vec::new();
        d.deal_into_hand(hash, &mut v);
        v
    }

    #[test]
    fn derived_hand_vectors() {
        let cases: &[(i32, i32, u64, &[u32])] = &[
            (128, 4, 0, &[0, 1, 2, 3]),
            (128, 4, 1, &[1, 0, 2, 3]),
            (128, 4, 127, &[127, 0, 1, 2]),
            (128, 4, 128, &[0, 2, 1, 3]),
            (128, 4, 12345678901234567, &[7, 14, 94, 102]),
            (64, 6, 0, &[0, 1, 2, 3, 4, 5]),
            (64, 6, (1 << 60) - 1, &[63, 0, 16, 6, 61, 28]),
            (128, 6, u64::MAX, &[127, 1, 7, 56, 91, 6]),
            (8, 8, 40319, &[7, 6, 5, 4, 3, 2, 1, 0]),
            (16, 4, 1001001001, &[9, 7, 15, 10]),
            (9, 3, 1001001001, &[4, 6, 0]),
            (9, 3, 2002002002, &[8, 2, 1]),
            (9, 1, 1001001001, &[4]),
            (9, 1, 2002002002, &[8]),
            (8, 3, 400900100100, &[4, 7, 5]),
            (8, 3, 300900200200, &[0, 6, 1]),
            (64, 7, 10010010010010, &[26, 34, 49, 6, 39, 27, 12]),
            (64, 7, 20020020020020, &[52, 3, 34, 14, 13, 56, 25]),
            (64, 7, 40040040040040, &[40, 7, 4, 29, 26, 48, 51]),
            (64, 7, 90090090090090, &[42, 49, 57, 63, 24, 56, 46]),
            (128, 6, 17644606172554983095, &[55, 62, 126, 125, 105, 1]),
            (128, 6, 5449774753716172163, &[3, 72, 82, 58, 1, 116]),
            (128, 6, 13424615363282033023, &[127, 66, 18, 15, 64, 74]),
            (64, 6, 11909065898299811039, &[31, 41, 53, 23, 38, 17]),
            (16, 4, 5788695476672829020, &[12, 8, 3, 2]),
        ];
        for (deck, h, hash, want) in cases {
            assert_eq!(hand(*deck, *h, *hash), want.to_vec(), "deck {deck} hand {h} hash {hash}");
        }
    }

    #[test]
    fn card_duplication_and_range() {
        // TestCardDuplication: every hand has distinct cards in [0, deck).
        for deck in [2, 7, 16, 64, 128, 1000] {
            for h in 1..=MAX_HAND as i32 {
                let Ok(d) = Dealer::new(deck, h) else { continue };
                for k in 0u64..200 {
                    let hash = k.wrapping_mul(0x9E3779B97F4A7C15);
                    let mut v = Vec::new();
                    d.deal_into_hand(hash, &mut v);
                    assert_eq!(v.len(), h as usize);
                    let mut s = v.clone();
                    s.sort_unstable();
                    s.dedup();
                    assert_eq!(s.len(), v.len());
                    assert!(v.iter().all(|c| *c < deck as u32));
                }
            }
        }
    }

    fn falling_factorial(n: u64, k: u64) -> u64 {
        (0..k).map(|i| n - i).product()
    }

    /// Upstream TestUniformDistribution.
    #[test]
    fn uniform_distribution() {
        let cases: &[(i32, i32, u64)] = &[
            // 64·63·62 = 249984 → ceil(log2) = 18 → 2^(18+4)
            (64, 3, 1 << 22),
            (128, 3, falling_factorial(128, 3)),
            (50, 4, falling_factorial(50, 4)),
        ];
        for (deck, h, n) in cases {
            let d = Dealer::new(*deck, *h).unwrap();
            let ff = falling_factorial(*deck as u64, *h as u64);
            let perm: u64 = (1..=*h as u64).product();
            let mut counts: HashMap<u64, u64> = HashMap::new();
            for hash in 0..*n {
                let (mut cards, k) = d.deal_array(hash);
                let s = &mut cards[..k];
                s.sort_unstable();
                let key = s.iter().fold(0u64, |acc, c| acc * 1024 + *c as u64);
                *counts.entry(key).or_default() += 1;
            }
            let lo = perm * (n / ff);
            let hi = perm * n.div_ceil(ff);
            assert_eq!(counts.len() as u64, ff / perm);
            for (k, c) in counts {
                assert!(c >= lo && c <= hi, "deck {deck} hand {h}: {k:?} occurred {c} times, want [{lo},{hi}]");
            }
        }
        assert_eq!(((64f64 * 63.0 * 62.0).log2()).ceil() as u32, 18);
    }
}
