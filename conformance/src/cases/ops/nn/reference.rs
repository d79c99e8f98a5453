//! Independent f64 references of the row and matrix ops, written from the mathematical definitions
//! (and PyTorch's documented semantics), never from the kernels. Rows are slices of f64 values.

/// Sum of a row in f64 with compensation (Neumaier), and the sum of absolute values.
pub fn sum(row: &[f64]) -> (f64, f64) {
    let (mut s, mut c, mut a) = (0.0f64, 0.0f64, 0.0f64);
    for &x in row {
        let t = s + x;
        c += if s.abs() >= x.abs() {
            (s - t) + x
        } else {
            (x - t) + s
        };
        s = t;
        a += x.abs();
    }
    if !s.is_finite() {
        // Infinities and NaN: IEEE semantics of the plain sum (compensation would make NaN).
        return (row.iter().sum(), a);
    }
    (s + c, a)
}

/// NaN-propagating max or min.
pub fn extreme(row: &[f64], max: bool) -> f64 {
    let mut m = if max {
        f64::NEG_INFINITY
    } else {
        f64::INFINITY
    };
    for &x in row {
        if x.is_nan() {
            return x;
        }
        if (max && x > m) || (!max && x < m) {
            m = x;
        }
    }
    m
}

/// First index of the max (or min), NaN counting as the extreme.
pub fn arg(row: &[f64], max: bool) -> usize {
    if let Some(i) = row.iter().position(|x| x.is_nan()) {
        return i;
    }
    let m = extreme(row, max);
    row.iter().position(|&x| x == m).unwrap_or(0)
}

/// log(sum(exp(row))), computed stably.
pub fn logsumexp(row: &[f64]) -> f64 {
    let m = extreme(row, true);
    if m.is_nan() || m == f64::NEG_INFINITY {
        return if m.is_nan() { m } else { f64::NAN };
    }
    if m == f64::INFINITY {
        return m;
    }
    m + sum(&row.iter().map(|&x| (x - m).exp()).collect::<Vec<_>>())
        .0
        .ln()
}

/// Softmax (or log-softmax) of a row.
pub fn softmax(row: &[f64], log: bool) -> Vec<f64> {
    let m = extreme(row, true);
    let e: Vec<f64> = row.iter().map(|&x| (x - m).exp()).collect();
    let s = sum(&e).0;
    if log {
        row.iter().map(|&x| x - m - s.ln()).collect()
    } else {
        e.iter().map(|&v| v / s).collect()
    }
}

/// Gradient of softmax (or log-softmax) given the forward output `y` and `dy`.
pub fn softmax_backward(y: &[f64], dy: &[f64], log: bool) -> Vec<f64> {
    if log {
        let s = sum(dy).0;
        y.iter().zip(dy).map(|(&y, &g)| g - y.exp() * s).collect()
    } else {
        let dot = sum(&y.iter().zip(dy).map(|(a, b)| a * b).collect::<Vec<_>>()).0;
        y.iter().zip(dy).map(|(&y, &g)| y * (g - dot)).collect()
    }
}

/// Cross-entropy of one row against class `t` with label smoothing `eps`:
/// `-sum_j q_j log p_j` with `q = (1-eps) onehot(t) + eps / C`.
pub fn cross_entropy(row: &[f64], t: usize, eps: f64) -> f64 {
    let lse = logsumexp(row);
    let c = row.len() as f64;
    let mean = sum(row).0 / c;
    (1.0 - eps) * (lse - row[t]) + eps * (lse - mean)
}

/// Gradient of [`cross_entropy`] with respect to the row, times `g`.
pub fn cross_entropy_grad(row: &[f64], t: usize, eps: f64, g: f64) -> Vec<f64> {
    let p = softmax(row, false);
    let c = row.len() as f64;
    p.iter()
        .enumerate()
        .map(|(j, &pj)| g * (pj - ((if j == t { 1.0 - eps } else { 0.0 }) + eps / c)))
        .collect()
}

/// Layer norm (or RMS norm) of a row: `(y, mean, rstd)`.
pub fn norm(
    row: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    eps: f64,
    rms: bool,
) -> (Vec<f64>, f64, f64) {
    let n = row.len() as f64;
    let mean = if rms { 0.0 } else { sum(row).0 / n };
    let var = sum(&row
        .iter()
        .map(|&x| (x - mean) * (x - mean))
        .collect::<Vec<_>>())
    .0 / n;
    let rstd = 1.0 / (var + eps).sqrt();
    let y = row
        .iter()
        .enumerate()
        .map(|(j, &x)| (x - mean) * rstd * w[j] + b.map_or(0.0, |b| b[j]))
        .collect();
    (y, mean, rstd)
}

/// Input gradient of layer norm (or RMS norm) for one row, from the saved statistics.
pub fn norm_backward(
    row: &[f64],
    dy: &[f64],
    w: &[f64],
    mean: f64,
    rstd: f64,
    rms: bool,
) -> Vec<f64> {
    let n = row.len() as f64;
    let xh: Vec<f64> = row.iter().map(|&x| (x - mean) * rstd).collect();
    let g: Vec<f64> = dy.iter().zip(w).map(|(a, b)| a * b).collect();
    let c1 = if rms { 0.0 } else { sum(&g).0 / n };
    let c2 = sum(&g.iter().zip(&xh).map(|(a, b)| a * b).collect::<Vec<_>>()).0 / n;
    (0..row.len())
        .map(|j| rstd * (g[j] - c1 - xh[j] * c2))
        .collect()
}

/// `alpha * a @ b + beta * c` for one (M, K) x (K, N) product, row-major slices; also the
/// per-element scale `|alpha| * sum_k |a_ik b_kj| + |beta c_ij|` for tolerances.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    a: &[f64],
    b: &[f64],
    c: &[f64],
    m: usize,
    n: usize,
    k: usize,
    alpha: f64,
    beta: f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = Vec::with_capacity(m * n);
    let mut scale = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let terms: Vec<f64> = (0..k).map(|q| a[i * k + q] * b[q * n + j]).collect();
            let (s, abs) = sum(&terms);
            let bc = if beta == 0.0 {
                0.0
            } else {
                beta * c[i * n + j]
            };
            out.push(alpha * s + bc);
            scale.push(alpha.abs() * abs + bc.abs());
        }
    }
    (out, scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_agree_with_hand_values() {
        assert_eq!(sum(&[1e16, 1.0, -1e16]).0, 1.0);
        assert_eq!(arg(&[1.0, 3.0, 3.0, f64::NAN], true), 3);
        assert_eq!(arg(&[1.0, 3.0, 3.0], true), 1);
        let p = softmax(&[0.0, 0.0], false);
        assert_eq!(p, vec![0.5, 0.5]);
        assert!((cross_entropy(&[0.0, 0.0], 0, 0.0) - 2f64.ln()).abs() < 1e-15);
        let (y, m, r) = norm(&[1.0, 3.0], &[1.0, 1.0], Some(&[0.0, 0.0]), 0.0, false);
        assert_eq!((m, r), (2.0, 1.0));
        assert_eq!(y, vec![-1.0, 1.0]);
        let (c, _) = matmul(&[1.0, 2.0], &[3.0, 4.0], &[10.0], 1, 1, 2, 1.0, 0.5);
        assert_eq!(c, vec![16.0]);
    }
}
