//! RFC 6962 (RFC 9162 §2.1) Merkle tree hashes and inclusion proofs over the chain heads a
//! checkpoint signs.
//!
//! INVARIANTS:
//! * Leaves and interior nodes are domain-separated (`0x00` / `0x01` prefixes), so a leaf can
//!   never pass for a node: the root commits to exactly the leaves, in order.
//! * [`verify_inclusion`] fails closed: an index outside the tree, a proof of the wrong length
//!   or any changed byte makes it return `false`.

use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// The hash of a leaf's bytes: SHA-256(0x00 ‖ data).
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    h.finalize().into()
}

/// The hash of an interior node: SHA-256(0x01 ‖ left ‖ right).
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The largest power of two below `n` (`n` ≥ 2).
fn split(n: usize) -> usize {
    let mut k = 1;
    while k << 1 < n {
        k <<= 1;
    }
    k
}

/// The Merkle tree hash of `leaves` (leaf hashes, in order); the empty tree's is SHA-256("").
pub fn root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => Sha256::digest([]).into(),
        1 => leaves[0],
        n => {
            let k = split(n);
            node_hash(&root(&leaves[..k]), &root(&leaves[k..]))
        }
    }
}

/// The audit path of leaf `index` in the tree of `leaves` (RFC 6962 §2.1.1); `None` when the
/// index is outside the tree.
pub fn inclusion_proof(leaves: &[Hash], index: usize) -> Option<Vec<Hash>> {
    if index >= leaves.len() {
        return None;
    }
    let mut proof = Vec::new();
    path(leaves, index, &mut proof);
    Some(proof)
}

fn path(leaves: &[Hash], m: usize, out: &mut Vec<Hash>) {
    let n = leaves.len();
    if n <= 1 {
        return;
    }
    let k = split(n);
    if m < k {
        path(&leaves[..k], m, out);
        out.push(root(&leaves[k..]));
    } else {
        path(&leaves[k..], m - k, out);
        out.push(root(&leaves[..k]));
    }
}

/// Whether `proof` shows leaf `leaf` at `index` in a tree of `size` leaves whose root is
/// `root` (RFC 9162 §2.1.3.2).
pub fn verify_inclusion(index: u64, size: u64, leaf: &Hash, proof: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    s == 0 && r == *root
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n)
            .map(|i| leaf_hash(format!("leaf {i}").as_bytes()))
            .collect()
    }

    #[test]
    fn every_leaf_of_every_small_tree_proves_and_no_other_does() {
        for n in 1..=17 {
            let ls = leaves(n);
            let r = root(&ls);
            for i in 0..n {
                let proof = inclusion_proof(&ls, i).unwrap();
                assert!(
                    verify_inclusion(i as u64, n as u64, &ls[i], &proof, &r),
                    "{n} {i}"
                );
                // Another leaf, another index, another size, a changed proof or root: refused.
                let other = leaf_hash(b"other");
                assert!(!verify_inclusion(i as u64, n as u64, &other, &proof, &r));
                if n > 1 {
                    assert!(!verify_inclusion(
                        ((i + 1) % n) as u64,
                        n as u64,
                        &ls[i],
                        &proof,
                        &r
                    ));
                    let mut bent = proof.clone();
                    bent[0][0] ^= 1;
                    assert!(!verify_inclusion(i as u64, n as u64, &ls[i], &bent, &r));
                    let mut short = proof.clone();
                    short.pop();
                    assert!(!verify_inclusion(i as u64, n as u64, &ls[i], &short, &r));
                }
                let mut bad_root = r;
                bad_root[31] ^= 1;
                assert!(!verify_inclusion(
                    i as u64, n as u64, &ls[i], &proof, &bad_root
                ));
            }
            assert!(inclusion_proof(&ls, n).is_none());
            assert!(!verify_inclusion(n as u64, n as u64, &ls[0], &[], &r));
        }
    }

    #[test]
    fn the_root_matches_rfc_6962_for_three_leaves() {
        // MTH(D[3]) = H(0x01 ‖ MTH(D[0:2]) ‖ MTH(D[2:3])), MTH(D[0:2]) = H(0x01 ‖ l0 ‖ l1).
        let ls = leaves(3);
        let expected = node_hash(&node_hash(&ls[0], &ls[1]), &ls[2]);
        assert_eq!(root(&ls), expected);
        assert_ne!(leaf_hash(&[]), node_hash(&[0; 32], &[0; 32]));
    }
}
