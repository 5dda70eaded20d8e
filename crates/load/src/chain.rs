//! The operation mix as a Markov chain: row-normalized transition weights, the next operation
//! drawn from the current one's row, and the long-run share of each operation (the chain's
//! stationary distribution), which the mix check compares a run with.

use anyhow::{bail, Result};
use rand::Rng;

#[derive(Debug, Clone)]
pub struct Chain {
    /// probs[i][j]: the probability that operation j follows operation i.
    probs: Vec<Vec<f64>>,
    /// Running sums of each row, for drawing.
    cumulative: Vec<Vec<f64>>,
}

impl Chain {
    /// A chain from a square matrix of non-negative weights; each row is normalized to sum
    /// to 1, so rows may be given in percent (as Olio's are) or any other scale.
    pub fn new(weights: &[Vec<f64>]) -> Result<Chain> {
        let n = weights.len();
        if n == 0 {
            bail!("the mix matrix is empty");
        }
        let mut probs = Vec::with_capacity(n);
        for (i, row) in weights.iter().enumerate() {
            if row.len() != n {
                bail!("mix matrix row {} has {} weights; a {n}-operation matrix needs {n}", i + 1, row.len());
            }
            if let Some(w) = row.iter().find(|w| !w.is_finite() || **w < 0.0) {
                bail!("mix matrix row {}: weight {w} is not a non-negative number", i + 1);
            }
            let sum: f64 = row.iter().sum();
            if sum <= 0.0 {
                bail!("mix matrix row {} has no positive weight: nothing could follow that operation", i + 1);
            }
            probs.push(row.iter().map(|w| w / sum).collect::<Vec<_>>());
        }
        let cumulative = probs
            .iter()
            .map(|row| {
                let mut acc = 0.0;
                row.iter()
                    .map(|p| {
                        acc += p;
                        acc
                    })
                    .collect()
            })
            .collect();
        let chain = Chain { probs, cumulative };
        chain.check_irreducible()?;
        Ok(chain)
    }

    pub fn len(&self) -> usize {
        self.probs.len()
    }

    #[cfg(test)]
    pub fn prob(&self, from: usize, to: usize) -> f64 {
        self.probs[from][to]
    }

    /// The operation after `from`, drawn with the row's probabilities.
    pub fn next(&self, from: usize, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.random();
        let row = &self.cumulative[from];
        row.iter().position(|&c| u < c).unwrap_or_else(|| {
            // u fell in the rounding gap above the last sum: take the last possible op.
            self.probs[from].iter().rposition(|&p| p > 0.0).unwrap_or(row.len() - 1)
        })
    }

    /// The stationary distribution π (π P = π, Σπ = 1), solved exactly by Gaussian
    /// elimination with partial pivoting on (Pᵀ - I) with one equation replaced by Σπ = 1.
    pub fn stationary(&self) -> Vec<f64> {
        let n = self.len();
        // a · x = b, a = Pᵀ - I, last row replaced by ones.
        let mut a: Vec<Vec<f64>> = (0..n).map(|i| (0..n).map(|j| self.probs[j][i] - if i == j { 1.0 } else { 0.0 }).collect()).collect();
        let mut b = vec![0.0; n];
        a[n - 1] = vec![1.0; n];
        b[n - 1] = 1.0;
        for col in 0..n {
            let pivot = (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs())).unwrap();
            a.swap(col, pivot);
            b.swap(col, pivot);
            let p = a[col][col];
            for row in 0..n {
                if row != col && a[row][col] != 0.0 {
                    let factor = a[row][col] / p;
                    let pivot_row = a[col].clone();
                    for (x, pivot) in a[row].iter_mut().zip(pivot_row).skip(col) {
                        *x -= factor * pivot;
                    }
                    b[row] -= factor * b[col];
                }
            }
        }
        (0..n).map(|i| b[i] / a[i][i]).collect()
    }

    /// Every operation must be reachable from every other, or the long-run mix would depend
    /// on where sessions start (and some operation might never run).
    fn check_irreducible(&self) -> Result<()> {
        let n = self.len();
        for start in 0..n {
            let mut seen = vec![false; n];
            let mut stack = vec![start];
            seen[start] = true;
            while let Some(i) = stack.pop() {
                for (j, seen_j) in seen.iter_mut().enumerate() {
                    if self.probs[i][j] > 0.0 && !*seen_j {
                        *seen_j = true;
                        stack.push(j);
                    }
                }
            }
            if let Some(missing) = seen.iter().position(|s| !s) {
                bail!(
                    "mix matrix: operation {} cannot be reached from operation {} (every operation must be reachable from every other)",
                    missing + 1,
                    start + 1
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    fn two_state() -> Chain {
        // From 0: stay 0.9; from 1: go back 0.5. π = (5/6, 1/6).
        Chain::new(&[vec![9.0, 1.0], vec![1.0, 1.0]]).unwrap()
    }

    #[test]
    fn stationary_of_a_known_chain() {
        let pi = two_state().stationary();
        assert!((pi[0] - 5.0 / 6.0).abs() < 1e-12, "{pi:?}");
        assert!((pi[1] - 1.0 / 6.0).abs() < 1e-12, "{pi:?}");
    }

    #[test]
    fn stationary_is_a_fixed_point() {
        let chain = Chain::new(&[vec![0.0, 3.0, 1.0], vec![2.0, 0.0, 2.0], vec![1.0, 1.0, 1.0]]).unwrap();
        let pi = chain.stationary();
        for j in 0..3 {
            let next: f64 = (0..3).map(|i| pi[i] * chain.prob(i, j)).sum();
            assert!((next - pi[j]).abs() < 1e-12);
        }
        assert!((pi.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn draws_follow_the_rows() {
        let chain = two_state();
        let mut rng = SmallRng::seed_from_u64(7);
        let n = 200_000;
        let stays = (0..n).filter(|_| chain.next(0, &mut rng) == 0).count();
        let share = stays as f64 / n as f64;
        assert!((share - 0.9).abs() < 0.005, "{share}");
    }

    #[test]
    fn bad_matrices_are_refused_with_reasons() {
        let e = Chain::new(&[vec![1.0, 1.0], vec![1.0]]).unwrap_err().to_string();
        assert!(e.contains("row 2 has 1 weights"), "{e}");
        let e = Chain::new(&[vec![1.0, -1.0], vec![1.0, 1.0]]).unwrap_err().to_string();
        assert!(e.contains("not a non-negative number"), "{e}");
        let e = Chain::new(&[vec![1.0, 1.0], vec![0.0, 0.0]]).unwrap_err().to_string();
        assert!(e.contains("row 2 has no positive weight"), "{e}");
        let e = Chain::new(&[vec![1.0, 0.0], vec![1.0, 1.0]]).unwrap_err().to_string();
        assert!(e.contains("cannot be reached"), "{e}");
    }
}
