//! `ops.index_select.<dtype>.<index dtype>` and `ops.index_add.<dtype>.<index dtype>`: row gather
//! and in-order scatter-add along axis 0, bit for bit against references written here (a gather
//! copies rows unchanged, special values included; a scatter-add adds the rows in index order,
//! each addition rounded to the accumulation dtype and then to the output dtype), over 2-D and 3-D
//! tables, empty and one-row tables, empty, single and repeated indices, offset, strided and
//! reversed index vectors, and sizes that take several blocks. `ops.index_{select,add}.out_of_range`:
//! an index outside the table is a fault reported by `synchronize`, and nothing is written through
//! it (no row outside the output, no row no valid index names).

use super::{dense, gen, numel, put, same_bits, Tensor, FLOATS};
use crate::case::{Case, CaseResult, Ctx, Failure, Need};
use crate::cases::ops::elementwise::Layout;
use crate::cases::ops::values::round_to;
use crate::ensure;
use std::sync::Arc;
use unihal_hal::{DType, HalError, OpCall, OpId, Stream, TensorView};

/// The index dtypes.
const INDEX: [DType; 2] = [DType::I32, DType::I64];

/// How the index vector is laid out (tables and rows must be dense; the index need not be).
#[derive(Debug, Clone, Copy, PartialEq)]
enum IdxLayout {
    Dense,
    /// Five elements into its buffer.
    Offset,
    /// Every third element.
    Strided,
    /// Negative stride.
    Reversed,
}

const IDX_LAYOUTS: [IdxLayout; 4] = [
    IdxLayout::Dense,
    IdxLayout::Offset,
    IdxLayout::Strided,
    IdxLayout::Reversed,
];

/// An index vector in device memory (the tensor keeps its buffer alive).
struct Index {
    _tensor: Tensor,
    view: TensorView,
}

fn index(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    it: DType,
    idx: &[i64],
    l: IdxLayout,
) -> unihal_hal::Result<Index> {
    let n = idx.len() as u64;
    let vals: Vec<f64> = idx.iter().map(|&i| i as f64).collect();
    Ok(match l {
        IdxLayout::Dense => {
            let t = put(ctx, s, it, &[n], Layout::Dense, &vals)?;
            Index {
                view: t.view(),
                _tensor: t,
            }
        }
        IdxLayout::Offset => {
            // Layout::Padded of a vector: dense, five elements in.
            let t = put(ctx, s, it, &[n], Layout::Padded, &vals)?;
            Index {
                view: t.view(),
                _tensor: t,
            }
        }
        IdxLayout::Reversed => {
            // Placed with a negative stride; element i of the view is idx[i].
            let t = put(ctx, s, it, &[n], Layout::Reversed, &vals)?;
            Index {
                view: t.view(),
                _tensor: t,
            }
        }
        IdxLayout::Strided => {
            // Element i at position 3 i + 1 of a (n, 3) block filled with out-of-range values.
            let mut all = vec![-7.0; 3 * idx.len()];
            for (i, &v) in vals.iter().enumerate() {
                all[3 * i + 1] = v;
            }
            let t = put(ctx, s, it, &[n, 3], Layout::Dense, &all)?;
            let v = t.view();
            let off = if n > 0 { it.size() as u64 } else { 0 };
            let view = TensorView::contiguous(&v.buffer, it, &[n]).strided(v.offset + off, &[3]);
            Index { view, _tensor: t }
        }
    })
}

/// Table values with special values sprinkled in (a gather must move them unchanged).
fn table_values(d: DType, n: usize, seed: u64) -> Vec<f64> {
    let mut v = gen(n, seed, -100.0, 100.0);
    let sub = match d {
        DType::F16 => 3.0 * 2f64.powi(-24),
        DType::Bf16 => 3.0 * 2f64.powi(-133),
        DType::F32 => 3.0 * 2f64.powi(-149),
        _ => f64::from_bits(3),
    };
    let sp = [-0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, sub, -sub];
    for (k, x) in sp.iter().enumerate() {
        if n > 0 {
            v[(3 + 11 * k) % n] = *x;
        }
    }
    v
}

/// `n` indices into `v` rows, repeated, naming the first and last rows.
fn indices(n: usize, v: usize, seed: u64) -> Vec<i64> {
    let mut idx: Vec<i64> = gen(n, seed, 0.0, v as f64)
        .iter()
        .map(|&x| (x as i64).min(v as i64 - 1))
        .collect();
    if n >= 2 {
        idx[0] = v as i64 - 1;
        idx[1] = 0;
    }
    if n >= 4 {
        idx[3] = idx[2]; // adjacent repeat
    }
    idx
}

#[allow(clippy::too_many_arguments)]
fn select_one(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    d: DType,
    it: DType,
    v: u64,
    inner: &[u64],
    n: usize,
    l: IdxLayout,
    seed: u64,
) -> CaseResult {
    let row = numel(inner);
    let tshape = [&[v][..], inner].concat();
    let oshape = [&[n as u64][..], inner].concat();
    let table = dense(ctx, s, d, &tshape, &table_values(d, v as usize * row, seed))?;
    let idx = indices(n, v as usize, seed + 1);
    let ix = index(ctx, s, it, &idx, l)?;
    let out = dense(ctx, s, d, &oshape, &gen(n * row, seed + 2, -1.0, 1.0))?;
    s.run_op(&OpCall::index_select(
        table.view(),
        ix.view.clone(),
        out.view(),
    ))?;
    s.synchronize()?;
    let what = format!("index_select {d} by {it}: table {tshape:?}, {n} indices ({l:?})");
    let got = out.read(ctx, &what)?;
    let want: Vec<f64> = idx
        .iter()
        .flat_map(|&r| {
            table.vals[r as usize * row..(r as usize + 1) * row]
                .iter()
                .copied()
        })
        .collect();
    same_bits(&what, d, &got, &want)?;
    same_bits(
        &format!("{what}: table"),
        d,
        &table.read(ctx, &what)?,
        &table.vals,
    )
}

fn select(ctx: &Ctx, d: DType, it: DType) -> CaseResult {
    let s = ctx.stream()?;
    let mut seed = 100;
    for inner in [&[7u64][..], &[3, 5], &[0]] {
        for v in [1u64, 37] {
            for n in [0usize, 1, 100] {
                for l in IDX_LAYOUTS {
                    seed += 10;
                    select_one(ctx, &s, d, it, v, inner, n, l, seed)?;
                }
            }
        }
    }
    // Enough rows for several blocks.
    select_one(ctx, &s, d, it, 37, &[100], 1000, IdxLayout::Dense, 7)?;
    select_one(ctx, &s, d, it, 37, &[100], 1000, IdxLayout::Reversed, 8)
}

/// One addition of `index_add`: in f32 (f64 for f64), then rounded to `d`.
fn add_rounded(d: DType, a: f64, b: f64) -> f64 {
    if d == DType::F64 {
        a + b
    } else {
        // The sum of two f32 values rounded once to f64 and then to f32 is the f32 sum.
        round_to(d, (a + b) as f32 as f64)
    }
}

#[allow(clippy::too_many_arguments)]
fn add_one(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    d: DType,
    it: DType,
    v: u64,
    inner: &[u64],
    n: usize,
    l: IdxLayout,
    seed: u64,
) -> CaseResult {
    let row = numel(inner);
    let oshape = [&[v][..], inner].concat();
    let sshape = [&[n as u64][..], inner].concat();
    let src = dense(ctx, s, d, &sshape, &gen(n * row, seed, -1.0, 1.0))?;
    let idx = indices(n, v as usize, seed + 1);
    let ix = index(ctx, s, it, &idx, l)?;
    let out = dense(
        ctx,
        s,
        d,
        &oshape,
        &gen(v as usize * row, seed + 2, -4.0, 4.0),
    )?;
    s.run_op(&OpCall::index_add(src.view(), ix.view.clone(), out.view()))?;
    s.synchronize()?;
    let what = format!("index_add {d} by {it}: {n} rows into {oshape:?} ({l:?})");
    let got = out.read(ctx, &what)?;
    let mut want = out.vals.clone();
    for (i, &r) in idx.iter().enumerate() {
        let r = r as usize;
        for j in 0..row {
            want[r * row + j] = add_rounded(d, want[r * row + j], src.vals[i * row + j]);
        }
    }
    same_bits(&what, d, &got, &want)?;
    same_bits(
        &format!("{what}: src"),
        d,
        &src.read(ctx, &what)?,
        &src.vals,
    )
}

fn add(ctx: &Ctx, d: DType, it: DType) -> CaseResult {
    let s = ctx.stream()?;
    let mut seed = 500;
    for inner in [&[5u64][..], &[3, 5], &[0]] {
        for (v, n) in [(7u64, 500usize), (1, 1), (1, 40), (7, 0), (37, 100)] {
            for l in IDX_LAYOUTS {
                seed += 10;
                add_one(ctx, &s, d, it, v, inner, n, l, seed)?;
            }
        }
    }
    // Columns split over several blocks.
    add_one(ctx, &s, d, it, 7, &[200], 500, IdxLayout::Dense, 9)?;
    add_one(ctx, &s, d, it, 7, &[200], 500, IdxLayout::Strided, 10)
}

/// Out-of-range indices of each index dtype: just outside on both sides, far outside, the extremes
/// of the dtype, and (for i64) a value whose low 32 bits are in range.
fn bad_indices(it: DType, v: i64) -> Vec<i64> {
    let mut b = vec![-1, v, -v - 1, v + 93, 1000];
    if it == DType::I32 {
        b.extend([i32::MIN as i64, i32::MAX as i64]);
    } else {
        b.extend([i64::MIN, i64::MAX, (1i64 << 33) + 2]);
    }
    b
}

/// `run_op` accepts the call and `synchronize` reports the fault. `Ok(false)` when the fault
/// poisons the device (nothing more can be read); on such a device the fault of an op's first
/// launch may already surface from `run_op` (its later launches see the poisoned context).
fn expect_fault(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    call: &OpCall,
    what: &str,
) -> Result<bool, Failure> {
    let poisons = ctx.device.capabilities().optional.fault_poisons_device;
    match s.run_op(call) {
        Ok(()) => {}
        Err(
            e @ (HalError::InvalidArgument { .. }
            | HalError::Unsupported { .. }
            | HalError::Unavailable { .. }),
        ) => {
            return Err(Failure::new(format!(
                "{what}: run_op refused the call ({e}); out-of-range indices are a stream fault"
            )))
        }
        Err(_) if poisons => return Ok(false),
        Err(e) => {
            return Err(Failure::new(format!(
                "{what}: run_op failed ({e}); the fault belongs to the stream"
            )))
        }
    }
    match s.synchronize() {
        Ok(()) => Err(Failure::new(format!(
            "{what}: synchronize succeeded despite out-of-range indices"
        ))),
        Err(
            e @ (HalError::InvalidArgument { .. }
            | HalError::Unsupported { .. }
            | HalError::Unavailable { .. }),
        ) => Err(Failure::new(format!(
            "{what}: the fault was reported as {e:?}"
        ))),
        Err(_) => Ok(!ctx.device.capabilities().optional.fault_poisons_device),
    }
}

/// A (rows + 2, row) tensor and the view of its rows 1..=rows (guard rows around it).
fn guarded(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    d: DType,
    rows: u64,
    row: u64,
    seed: u64,
) -> unihal_hal::Result<(Tensor, TensorView)> {
    let t = dense(
        ctx,
        s,
        d,
        &[rows + 2, row],
        &gen(((rows + 2) * row) as usize, seed, -4.0, 4.0),
    )?;
    let v = t.view();
    let view = TensorView::contiguous(&v.buffer, d, &[rows, row])
        .strided(v.offset + row * d.size() as u64, &[row as i64, 1]);
    Ok((t, view))
}

fn select_out_of_range(ctx: &Ctx) -> CaseResult {
    let d = DType::F32;
    let (v, row) = (7i64, 5usize);
    for it in INDEX {
        let s = ctx.stream()?;
        let table = dense(
            ctx,
            &s,
            d,
            &[v as u64, row as u64],
            &gen(v as usize * row, 1, -1.0, 1.0),
        )?;
        // Valid and invalid indices interleaved.
        let mut idx = Vec::new();
        for (k, b) in bad_indices(it, v).into_iter().enumerate() {
            idx.push((k as i64 * 3) % v);
            idx.push(b);
        }
        idx.push(v - 1);
        let n = idx.len();
        let ix = index(ctx, &s, it, &idx, IdxLayout::Dense)?;
        let (out, out_view) = guarded(ctx, &s, d, n as u64, row as u64, 2)?;
        let what = format!("index_select with out-of-range {it} indices");
        if !expect_fault(
            ctx,
            &s,
            &OpCall::index_select(table.view(), ix.view.clone(), out_view),
            &what,
        )? {
            return Ok(()); // the device is poisoned: the remaining index dtypes cannot run
        }
        let got = out.read(ctx, &what)?;
        let before = &out.vals;
        for (i, &r) in idx.iter().enumerate() {
            for j in 0..row {
                let (e, at) = (got[(i + 1) * row + j], (i + 1) * row + j);
                let ok = if (0..v).contains(&r) {
                    e == before[at] || e == table.vals[r as usize * row + j]
                } else {
                    e == before[at]
                };
                ensure!(ok, "{what}: out[{i}][{j}] (index {r}) = {e:e}: neither its old value nor the gathered one");
            }
        }
        for j in 0..row {
            ensure!(
                got[j] == before[j] && got[(n + 1) * row + j] == before[(n + 1) * row + j],
                "{what}: a guard row around the output was written"
            );
        }
        ensure!(
            table.read(ctx, &what)? == table.vals,
            "{what}: the table changed"
        );
    }
    Ok(())
}

fn add_out_of_range(ctx: &Ctx) -> CaseResult {
    let d = DType::F32;
    let (v, row) = (7i64, 5usize);
    for it in INDEX {
        let s = ctx.stream()?;
        // Valid indices only name rows 1..v-1: rows 0 and v-1 (where clamped or wrapped indices
        // would land) and the guard rows must not change.
        let mut idx = Vec::new();
        for (k, b) in bad_indices(it, v).into_iter().enumerate() {
            idx.push(1 + (k as i64 * 2) % (v - 2));
            idx.push(b);
        }
        idx.push(2);
        let n = idx.len();
        let src = dense(
            ctx,
            &s,
            d,
            &[n as u64, row as u64],
            &gen(n * row, 3, -1.0, 1.0),
        )?;
        let ix = index(ctx, &s, it, &idx, IdxLayout::Dense)?;
        let (out, out_view) = guarded(ctx, &s, d, v as u64, row as u64, 4)?;
        let what = format!("index_add with out-of-range {it} indices");
        if !expect_fault(
            ctx,
            &s,
            &OpCall::index_add(src.view(), ix.view.clone(), out_view),
            &what,
        )? {
            return Ok(()); // the device is poisoned: the remaining index dtypes cannot run
        }
        let got = out.read(ctx, &what)?;
        let before = &out.vals;
        for r in 0..v as usize + 2 {
            for j in 0..row {
                let at = r * row + j;
                // Every value a column may hold: its old value and each partial sum in index order
                // (a device may stop the kernel part way).
                let mut ok_vals = vec![before[at]];
                if r >= 1 && r <= v as usize {
                    let mut acc = before[at];
                    for (i, &x) in idx.iter().enumerate() {
                        if x == r as i64 - 1 {
                            acc = add_rounded(d, acc, src.vals[i * row + j]);
                            ok_vals.push(acc);
                        }
                    }
                }
                let g = got[at];
                let full = *ok_vals.last().expect("non-empty");
                ensure!(
                    ok_vals.contains(&g),
                    "{what}: out row {} col {j} = {g:e}; old value {:e}, in-order sum of its valid rows {full:e}{}",
                    r as i64 - 1,
                    before[at],
                    if ok_vals.len() == 1 { " (no valid index names this row)" } else { "" }
                );
            }
        }
        ensure!(src.read(ctx, &what)? == src.vals, "{what}: src changed");
    }
    Ok(())
}

/// The gather/scatter cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for d in FLOATS {
        for it in INDEX {
            v.push(
                Case::new(
                    format!("ops.index_select.{}.{}", d.name(), it.name()),
                    move |c| select(c, d, it),
                )
                .needs(&[Need::Op(OpId::IndexSelect, d)]),
            );
            v.push(
                Case::new(
                    format!("ops.index_add.{}.{}", d.name(), it.name()),
                    move |c| add(c, d, it),
                )
                .needs(&[Need::Op(OpId::IndexAdd, d)]),
            );
        }
    }
    v.push(
        Case::new("ops.index_select.out_of_range", select_out_of_range)
            .needs(&[Need::Op(OpId::IndexSelect, DType::F32)])
            .faulting(),
    );
    v.push(
        Case::new("ops.index_add.out_of_range", add_out_of_range)
            .needs(&[Need::Op(OpId::IndexAdd, DType::F32)])
            .faulting(),
    );
    v
}
