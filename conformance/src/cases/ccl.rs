//! `ccl.*`: collectives on communicators among the backend's devices (in one process): every op ×
//! dtype × rank count (1-4, non-powers of two included), every reduction, counts 0, 1, odd and
//! large, in place and out of place, root and peer variations, with data chosen so every partial
//! result is exact in any order; misuse; a missing rank times out within its bound; abort unblocks.

use crate::case::{expect_invalid, Case, CaseResult, Ctx, Failure, Need};
use crate::cases::ops::values::{decode, encode};
use crate::{ensure, ensure_eq};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{
    Buffer, CollectiveOp, CommConfig, Communicator, DType, Device, HalError, Invalid, ReduceOp,
    Stream,
};

const DTYPES: [DType; 7] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::Bf16,
    DType::I32,
    DType::I64,
    DType::U8,
];
const COUNTS: [u64; 4] = [0, 1, 1037, 16411];

/// Ranks, their communicators and one stream each: rank 0 on the context's device.
struct World {
    devices: Vec<Arc<dyn Device>>,
    comms: Vec<Arc<dyn Communicator>>,
    streams: Vec<Arc<dyn Stream>>,
}

fn world(ctx: &Ctx, n: usize, config: &CommConfig) -> unihal_hal::Result<World> {
    let total = ctx.backend.probe()?;
    let me = ctx.device.id().ordinal as usize;
    let devices: Vec<Arc<dyn Device>> = (0..n)
        .map(|i| ctx.backend.open((me + i) % total))
        .collect::<Result<_, _>>()?;
    let ccl = ctx
        .backend
        .collectives()
        .ok_or_else(|| HalError::unsupported("collectives"))?;
    let comms = ccl.init_all(&devices, config)?;
    let streams = devices
        .iter()
        .map(|d| d.create_stream())
        .collect::<Result<_, _>>()?;
    Ok(World {
        devices,
        comms,
        streams,
    })
}

/// Exact-in-any-order input value of element `i` on `rank` for a reduction.
fn value(red: Option<ReduceOp>, d: DType, n: usize, rank: usize, i: u64) -> f64 {
    let k = ((i * 7 + rank as u64 * 3) % 4) as f64;
    match red {
        Some(ReduceOp::Prod) => {
            if d == DType::U8 {
                [1.0, 2.0][((i + rank as u64) % 2) as usize]
            } else {
                [-1.0, 1.0, 2.0][((i + rank as u64) % 3) as usize]
            }
        }
        Some(ReduceOp::Avg) => n as f64 * k,
        _ => k,
    }
}

fn reduce_ref(red: ReduceOp, vals: &[f64]) -> f64 {
    match red {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Prod => vals.iter().product(),
        ReduceOp::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => vals.iter().sum::<f64>() / vals.len() as f64,
    }
}

fn upload(
    ctx_dev: &Arc<dyn Device>,
    s: &Arc<dyn Stream>,
    d: DType,
    vals: &[f64],
    extra: usize,
) -> unihal_hal::Result<Buffer> {
    let mut bytes: Vec<u8> = vals.iter().flat_map(|&v| encode(d, v)).collect();
    bytes.extend(std::iter::repeat_n(0xEEu8, extra * d.size()));
    let b = ctx_dev.alloc(bytes.len())?;
    s.write(&b, 0, &bytes)?;
    Ok(b)
}

fn download(s: &Arc<dyn Stream>, d: DType, b: &Buffer) -> unihal_hal::Result<Vec<f64>> {
    let mut out = vec![0u8; b.len() as usize];
    s.read(b, 0, &mut out)?;
    Ok(out.chunks(d.size()).map(|c| decode(d, c)).collect())
}

fn check_vals(what: &str, got: &[f64], want: &[f64]) -> CaseResult {
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        return Err(Failure::new(format!(
            "{what}: element {i}: got {}, expected {}",
            got[i], want[i]
        )));
    }
    Ok(())
}

/// Runs `op` on `n` ranks for every reduction, count and placement.
#[allow(clippy::needless_range_loop)] // ranks index several parallel vectors
fn run_op(ctx: &Ctx, op: CollectiveOp, d: DType, n: usize) -> CaseResult {
    let w = world(ctx, n, &CommConfig::default())?;
    let reds: Vec<Option<ReduceOp>> = if op.reduces() {
        ReduceOp::ALL.iter().map(|&r| Some(r)).collect()
    } else {
        vec![None]
    };
    let nu = n as u64;
    for red in reds {
        for count in COUNTS {
            for in_place in [false, true] {
                if in_place && matches!(op, CollectiveOp::AllToAll | CollectiveOp::SendRecv) {
                    continue;
                }
                let root = (count as usize + 1) % n;
                let what = format!(
                    "{} {d} {} ranks {n} count {count}{}",
                    op.name(),
                    red.map_or(String::new(), |r| r.name().into()),
                    if in_place { " in place" } else { "" }
                );
                // Per-rank send contents and buffer sizes.
                let send_elems = match op {
                    CollectiveOp::ReduceScatter | CollectiveOp::AllToAll => nu * count,
                    _ => count,
                };
                let recv_elems = match op {
                    CollectiveOp::AllGather | CollectiveOp::AllToAll => nu * count,
                    _ => count,
                };
                let sends: Vec<Vec<f64>> = (0..n)
                    .map(|r| (0..send_elems).map(|i| value(red, d, n, r, i)).collect())
                    .collect();
                let mut sbufs = Vec::new();
                let mut rbufs = Vec::new();
                for r in 0..n {
                    let s = &w.streams[r];
                    if in_place && op == CollectiveOp::ReduceScatter {
                        // The recv lies inside send, at this rank's block.
                        let sb = upload(&w.devices[r], s, d, &sends[r], 0)?;
                        rbufs.push(
                            sb.slice(r as u64 * count * d.size() as u64, count * d.size() as u64)?,
                        );
                        sbufs.push(sb);
                    } else if in_place {
                        // The send lies inside recv where each op expects it.
                        let mut image = vec![0.0; recv_elems as usize];
                        let at = if matches!(op, CollectiveOp::AllGather) {
                            r as u64 * count
                        } else {
                            0
                        };
                        image[at as usize..(at + send_elems) as usize].copy_from_slice(&sends[r]);
                        let rb = upload(&w.devices[r], s, d, &image, 0)?;
                        sbufs.push(rb.slice(at * d.size() as u64, send_elems * d.size() as u64)?);
                        rbufs.push(rb);
                    } else {
                        sbufs.push(upload(&w.devices[r], s, d, &sends[r], 0)?);
                        rbufs.push(upload(
                            &w.devices[r],
                            s,
                            d,
                            &vec![0.0; recv_elems as usize],
                            3,
                        )?);
                    }
                }
                for r in 0..n {
                    let (c, s, sb, rb) = (&w.comms[r], &w.streams[r], &sbufs[r], &rbufs[r]);
                    match op {
                        CollectiveOp::AllReduce => {
                            c.all_reduce(sb, rb, count, d, red.unwrap(), s)?
                        }
                        CollectiveOp::Broadcast => c.broadcast(sb, rb, count, d, root, s)?,
                        CollectiveOp::Reduce => {
                            c.reduce(sb, rb, count, d, red.unwrap(), root, s)?
                        }
                        CollectiveOp::AllGather => c.all_gather(sb, rb, count, d, s)?,
                        CollectiveOp::ReduceScatter => {
                            c.reduce_scatter(sb, rb, count, d, red.unwrap(), s)?
                        }
                        CollectiveOp::AllToAll => c.all_to_all(sb, rb, count, d, s)?,
                        CollectiveOp::SendRecv => {
                            // A ring: send to the next rank, receive from the previous one.
                            c.send(sb, count, d, (r + 1) % n, s)?;
                            c.recv(rb, count, d, (r + n - 1) % n, s)?;
                        }
                    }
                }
                for s in &w.streams {
                    s.synchronize()?;
                }
                for r in 0..n {
                    let got = download(&w.streams[r], d, &rbufs[r])?;
                    let got = &got[..recv_elems as usize];
                    let want: Vec<f64> = match op {
                        CollectiveOp::AllReduce => (0..count)
                            .map(|i| {
                                reduce_ref(
                                    red.unwrap(),
                                    &sends.iter().map(|s| s[i as usize]).collect::<Vec<_>>(),
                                )
                            })
                            .collect(),
                        CollectiveOp::Reduce if r == root => (0..count)
                            .map(|i| {
                                reduce_ref(
                                    red.unwrap(),
                                    &sends.iter().map(|s| s[i as usize]).collect::<Vec<_>>(),
                                )
                            })
                            .collect(),
                        CollectiveOp::Reduce => {
                            if in_place {
                                sends[r].clone()
                            } else {
                                vec![0.0; count as usize]
                            }
                        }
                        CollectiveOp::Broadcast => sends[root].clone(),
                        CollectiveOp::AllGather => sends.iter().flatten().cloned().collect(),
                        CollectiveOp::ReduceScatter => (0..count)
                            .map(|i| {
                                reduce_ref(
                                    red.unwrap(),
                                    &sends
                                        .iter()
                                        .map(|s| s[(r as u64 * count + i) as usize])
                                        .collect::<Vec<_>>(),
                                )
                            })
                            .collect(),
                        CollectiveOp::AllToAll => (0..n)
                            .flat_map(|j| {
                                sends[j]
                                    [(r as u64 * count) as usize..((r as u64 + 1) * count) as usize]
                                    .to_vec()
                            })
                            .collect(),
                        CollectiveOp::SendRecv => sends[(r + n - 1) % n].clone(),
                    };
                    let want: Vec<f64> = want.iter().map(|&v| decode(d, &encode(d, v))).collect();
                    check_vals(&format!("{what}: rank {r}"), got, &want)?;
                }
            }
        }
    }
    Ok(())
}

fn misuse(ctx: &Ctx) -> CaseResult {
    let w = world(ctx, 2, &CommConfig::default())?;
    let (c, s) = (&w.comms[0], &w.streams[0]);
    let b = w.devices[0].alloc(64)?;
    let r = expect_invalid(c.broadcast(&b, &b, 4, DType::F32, 2, s), "root")?;
    ensure_eq!(
        r,
        Invalid::Value {
            value: "2".into(),
            accepted: "0..2".into()
        },
        "root out of range"
    );
    let r = expect_invalid(c.send(&b, 4, DType::F32, 5, s), "peer")?;
    ensure_eq!(
        r,
        Invalid::Value {
            value: "5".into(),
            accepted: "0..2".into()
        },
        "peer out of range"
    );
    let r = expect_invalid(
        c.all_reduce(&b, &b, 17, DType::F32, ReduceOp::Sum, s),
        "send",
    )?;
    ensure_eq!(
        r,
        Invalid::OutOfRange {
            offset: 0,
            len: 68,
            size: 64
        },
        "count larger than the buffer"
    );
    let other = w.devices[1].alloc(64)?;
    let r = expect_invalid(
        c.all_reduce(&other, &b, 4, DType::F32, ReduceOp::Sum, s),
        "send",
    )?;
    ensure!(
        matches!(r, Invalid::WrongDevice { .. }),
        "buffer of another rank's device: {r:?}"
    );
    let r = expect_invalid(
        c.all_reduce(&b, &b, 4, DType::F32, ReduceOp::Sum, &w.streams[1]),
        "stream",
    )?;
    ensure!(
        matches!(r, Invalid::WrongDevice { .. }),
        "stream of another device: {r:?}"
    );
    match c.all_reduce(&b, &b, 4, DType::Bool, ReduceOp::Sum, s) {
        Err(HalError::Unsupported { .. }) => {}
        other => return Err(Failure::new(format!("sum of bool gave {other:?}"))),
    }
    ensure!(
        !ctx.backend.collectives().unwrap().capabilities().supports(
            CollectiveOp::AllReduce,
            DType::Bool,
            Some(ReduceOp::Sum)
        ),
        "capabilities claim bool sums"
    );
    ensure!(c.async_error().is_none(), "rejected calls left an error");
    Ok(())
}

fn mismatched(ctx: &Ctx) -> CaseResult {
    let w = world(
        ctx,
        2,
        &CommConfig {
            timeout: Some(Duration::from_secs(5)),
        },
    )?;
    let b0 = w.devices[0].alloc(64)?;
    let b1 = w.devices[1].alloc(64)?;
    w.comms[0].all_reduce(&b0, &b0, 4, DType::F32, ReduceOp::Sum, &w.streams[0])?;
    w.comms[1].all_reduce(&b1, &b1, 8, DType::F32, ReduceOp::Sum, &w.streams[1])?;
    for (r, s) in w.streams.iter().enumerate() {
        match s.synchronize() {
            Err(HalError::InvalidArgument { .. }) | Err(HalError::Timeout { .. }) => {}
            other => {
                return Err(Failure::new(format!(
                    "rank {r} after mismatched counts: {other:?}"
                )))
            }
        }
    }
    Ok(())
}

fn missing_rank(ctx: &Ctx) -> CaseResult {
    let limit = Duration::from_millis(300);
    let w = world(
        ctx,
        3,
        &CommConfig {
            timeout: Some(limit),
        },
    )?;
    let t0 = Instant::now();
    // Ranks 0 and 1 call; rank 2 never does.
    for r in 0..2 {
        let b = w.devices[r].alloc(64)?;
        w.comms[r].all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &w.streams[r])?;
    }
    for r in 0..2 {
        match w.streams[r].synchronize() {
            Err(HalError::Timeout { what, .. }) => {
                ensure!(
                    what.contains("[2]"),
                    "rank {r}: timeout does not name the missing rank: {what}"
                );
            }
            other => return Err(Failure::new(format!("rank {r} without rank 2: {other:?}"))),
        }
        ensure!(
            matches!(w.comms[r].async_error(), Some(HalError::Timeout { .. })),
            "rank {r}: no sticky communicator error"
        );
    }
    let el = t0.elapsed();
    ensure!(
        el < limit + Duration::from_millis(1500),
        "the timeout of {limit:?} took {el:?}"
    );
    Ok(())
}

fn abort_unblocks(ctx: &Ctx) -> CaseResult {
    let w = world(
        ctx,
        2,
        &CommConfig {
            timeout: Some(Duration::from_secs(30)),
        },
    )?;
    let b = w.devices[0].alloc(64)?;
    w.comms[0].all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &w.streams[0])?;
    let c1 = w.comms[1].clone();
    let t0 = Instant::now();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        c1.abort();
    });
    let r = w.streams[0].synchronize();
    t.join()
        .map_err(|_| Failure::new("abort thread panicked"))?;
    ensure!(
        matches!(r, Err(HalError::Aborted { .. })),
        "pending op after abort: {r:?}"
    );
    ensure!(
        t0.elapsed() < Duration::from_secs(5),
        "abort took {:?} to unblock",
        t0.elapsed()
    );
    let again = w.comms[0].all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &w.streams[0]);
    ensure!(again.is_err(), "an aborted communicator accepted new work");
    Ok(())
}

/// The collective cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for op in CollectiveOp::ALL {
        for d in DTYPES {
            if op.reduces() && d == DType::Bool {
                continue;
            }
            for n in 1..=4usize {
                v.push(
                    Case::new(
                        format!("ccl.{}.{}.ranks{n}", op.name(), d.name()),
                        move |c| run_op(c, op, d, n),
                    )
                    .needs(&[Need::Devices(n), Need::Collective(op, d)]),
                );
            }
        }
    }
    v.push(Case::new("ccl.misuse.invalid_arguments", misuse).needs(&[
        Need::Devices(2),
        Need::Collective(CollectiveOp::AllReduce, DType::F32),
    ]));
    v.push(
        Case::new("ccl.misuse.mismatched_counts", mismatched).needs(&[
            Need::Devices(2),
            Need::Collective(CollectiveOp::AllReduce, DType::F32),
        ]),
    );
    v.push(
        Case::new("ccl.failure.missing_rank_times_out", missing_rank).needs(&[
            Need::Devices(3),
            Need::Collective(CollectiveOp::AllReduce, DType::F32),
        ]),
    );
    v.push(
        Case::new("ccl.failure.abort_unblocks", abort_unblocks).needs(&[
            Need::Devices(2),
            Need::Collective(CollectiveOp::AllReduce, DType::F32),
        ]),
    );
    v
}
