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
    Buffer, CclCaps, CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError,
    Invalid, ReduceOp, Stream,
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

/// Collective timeout of the cases: a rank that fails early makes the others fail this fast.
const CASE_TIMEOUT: Duration = Duration::from_secs(20);

fn config() -> CommConfig {
    CommConfig {
        timeout: Some(CASE_TIMEOUT),
    }
}

/// One rank of a case: its communicator, device and a stream of that device.
pub(crate) struct Rank {
    pub comm: Arc<dyn Communicator>,
    pub device: Arc<dyn Device>,
    pub stream: Arc<dyn Stream>,
}

impl Rank {
    fn new(comm: Arc<dyn Communicator>) -> unihal_hal::Result<Rank> {
        let device = comm.device().clone();
        let stream = device.create_stream()?;
        Ok(Rank {
            comm,
            device,
            stream,
        })
    }
}

/// Runs `body` on every rank of a new `n`-rank communicator. In one process the ranks are the
/// context's device and the next ones, each body on its own thread; in an SPMD run the ranks are
/// processes `0..n` of the world (split from it; the others sit the case out), and the processes
/// agree on the outcome so every one reports the same.
pub(crate) fn on_ranks(
    ctx: &Ctx,
    n: usize,
    config: &CommConfig,
    body: impl Fn(&Rank) -> CaseResult + Sync,
) -> CaseResult {
    let Some(world) = &ctx.world else {
        let devices = rank_devices(ctx, n)?;
        let ccl = engine(ctx)?;
        let ranks: Vec<Rank> = ccl
            .init_all(&devices, config)?
            .into_iter()
            .map(Rank::new)
            .collect::<Result<_, _>>()?;
        let results: Vec<CaseResult> = std::thread::scope(|sc| {
            let hs: Vec<_> = ranks.iter().map(|r| sc.spawn(|| body(r))).collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Failure::new("rank thread panicked")))
                })
                .collect()
        });
        return first_failure(results);
    };
    let me = world.rank();
    let mine = world
        .split((me < n).then_some(0), me as i32, config)
        .map_err(Failure::from)
        .and_then(|c| match c {
            Some(c) => body(&Rank::new(c)?),
            None => Ok(()),
        })
        .map_err(|f| Failure::new(format!("rank {me}: {}", f.message)));
    agree(world, mine)
}

/// Runs `body` on every rank of a new `n`-rank communicator made the way multi-process jobs make
/// theirs: rank 0 asks for a unique id, the id is handed to the others, and each rank calls
/// `init_rank` from its own thread (in one process: the context's device and the next ones; in
/// an SPMD run, which needs a world of exactly `n` processes: every process, the id broadcast
/// over the world).
pub(crate) fn on_ranks_by_id(
    ctx: &Ctx,
    n: usize,
    config: &CommConfig,
    body: impl Fn(&Rank) -> CaseResult + Sync,
) -> CaseResult {
    let ccl = engine(ctx)?;
    let Some(world) = &ctx.world else {
        let devices = rank_devices(ctx, n)?;
        let (tx, rx) = std::sync::mpsc::channel::<unihal_hal::UniqueId>();
        let rx = std::sync::Mutex::new(rx);
        let txs: Vec<_> = (1..n).map(|_| tx.clone()).collect();
        let results: Vec<CaseResult> = std::thread::scope(|sc| {
            let hs: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(r, d)| {
                    let (rx, txs, body) = (&rx, &txs, &body);
                    sc.spawn(move || -> CaseResult {
                        let id = if r == 0 {
                            let id = ccl.unique_id()?;
                            for t in txs {
                                let _ = t.send(id.clone());
                            }
                            id
                        } else {
                            rx.lock()
                                .map_err(|_| Failure::new("id channel poisoned"))?
                                .recv_timeout(Duration::from_secs(30))
                                .map_err(|e| Failure::new(format!("no id from rank 0: {e}")))?
                        };
                        let comm = ccl.init_rank(&id, n, r, d, config)?;
                        ensure_eq!((comm.rank(), comm.size()), (r, n), "rank and size");
                        body(&Rank::new(comm)?)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Failure::new("rank thread panicked")))
                })
                .collect()
        });
        drop(tx);
        return first_failure(results);
    };
    let me = world.rank();
    let mine = (|| -> CaseResult {
        let s = world.device().create_stream()?;
        let id = if me == 0 {
            ccl.unique_id()?.0
        } else {
            Vec::new()
        };
        // The id's length, then its bytes, from rank 0.
        let len = world.device().alloc(8)?;
        s.write(&len, 0, &(id.len() as u64).to_le_bytes())?;
        world.broadcast(&len, &len, 8, DType::U8, 0, &s)?;
        let mut lb = [0u8; 8];
        s.read(&len, 0, &mut lb)?;
        let n_bytes = u64::from_le_bytes(lb) as usize;
        ensure!(
            (1..=1 << 20).contains(&n_bytes),
            "id length {n_bytes} from rank 0"
        );
        let bytes = world.device().alloc(n_bytes)?;
        if me == 0 {
            s.write(&bytes, 0, &id)?;
        }
        world.broadcast(&bytes, &bytes, n_bytes as u64, DType::U8, 0, &s)?;
        let mut id = vec![0u8; n_bytes];
        s.read(&bytes, 0, &mut id)?;
        let comm = ccl.init_rank(&unihal_hal::UniqueId(id), n, me, world.device(), config)?;
        ensure_eq!((comm.rank(), comm.size()), (me, n), "rank and size");
        body(&Rank::new(comm)?)
    })()
    .map_err(|f| Failure::new(format!("rank {me}: {}", f.message)));
    agree(world, mine)
}

/// Ranks made by `init_rank` run collectives: an all-reduce and a broadcast whose results show
/// every rank took part with the right rank.
fn init_rank_works(ctx: &Ctx, n: usize) -> CaseResult {
    on_ranks_by_id(ctx, n, &config(), |rk| {
        let (r, s) = (rk.comm.rank(), &rk.stream);
        let vals: Vec<f64> = (0..64).map(|i| (i % 5 + r) as f64).collect();
        let b = upload(&rk.device, s, DType::F32, &vals, 0)?;
        rk.comm
            .all_reduce(&b, &b, 64, DType::F32, ReduceOp::Sum, s)?;
        let want: Vec<f64> = (0..64)
            .map(|i| (0..n).map(|q| (i % 5 + q) as f64).sum())
            .collect();
        check_vals("all_reduce", &download(s, DType::F32, &b)?, &want)?;
        let root = n - 1;
        let c = upload(&rk.device, s, DType::I32, &[r as f64 * 10.0; 4], 0)?;
        rk.comm.broadcast(&c, &c, 4, DType::I32, root, s)?;
        check_vals(
            "broadcast",
            &download(s, DType::I32, &c)?,
            &[root as f64 * 10.0; 4],
        )
    })
}

/// A way to make `n` ranks with a config and run a body on each (`on_ranks`, `on_ranks_by_id`).
type MakeRanks = fn(&Ctx, usize, &CommConfig, &(dyn Fn(&Rank) -> CaseResult + Sync)) -> CaseResult;

/// The timeouts a caller may give a communicator, made by `make` (`on_ranks` or
/// `on_ranks_by_id`): `Duration::MAX` and 1e19 s, longer than the clock holds, are no deadline
/// (the communicator is made and reduces; once `Instant::now() + timeout` panicked at its
/// creation or on its stream); one under 1 ms cannot work (1e-300 s is a zero `Duration`) and is
/// refused with `InvalidArgument` naming `CommConfig::timeout` on every rank, before any exchange
/// with the others (so no rank is left waiting).
fn timeout_extremes(ctx: &Ctx, make: MakeRanks) -> CaseResult {
    for t in [Duration::MAX, Duration::from_secs_f64(1e19)] {
        let cfg = CommConfig { timeout: Some(t) };
        make(ctx, 2, &cfg, &|rk| {
            let r = rk.comm.rank();
            let b = upload(&rk.device, &rk.stream, DType::F32, &[r as f64 + 1.0; 16], 0)?;
            rk.comm
                .all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &rk.stream)?;
            check_vals(
                "all_reduce",
                &download(&rk.stream, DType::F32, &b)?,
                &[3.0; 16],
            )
        })
        .map_err(|f| Failure::new(format!("timeout {t:?}: {}", f.message)))?;
    }
    for t in [Duration::from_secs_f64(1e-300), Duration::from_micros(999)] {
        let cfg = CommConfig { timeout: Some(t) };
        let r = make(ctx, 2, &cfg, &|_| Ok(()));
        let Err(f) = r else {
            return Err(Failure::new(format!("a timeout of {t:?} was accepted")));
        };
        ensure!(
            f.message.contains("CommConfig::timeout") && !f.message.contains("panicked"),
            "a timeout of {t:?}: the refusal does not name CommConfig::timeout: {}",
            f.message
        );
    }
    Ok(())
}

/// Runs `init_rank` on the context's device and the next ones, rank `r` with `ids[r]`, from
/// threads; returns each rank's result (communicators dropped) and how long the slowest took.
fn init_ranks_with(
    ctx: &Ctx,
    ids: &[unihal_hal::UniqueId],
    nranks: usize,
    config: &CommConfig,
) -> Result<(Vec<unihal_hal::Result<()>>, Duration), Failure> {
    let ccl = engine(ctx)?;
    let devices = rank_devices(ctx, ids.len())?;
    let t0 = Instant::now();
    let results = std::thread::scope(|sc| {
        let hs: Vec<_> = devices
            .iter()
            .zip(ids)
            .enumerate()
            .map(|(r, (d, id))| sc.spawn(move || ccl.init_rank(id, nranks, r, d, config).map(drop)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(HalError::Internal("init_rank panicked".into())))
            })
            .collect()
    });
    Ok((results, t0.elapsed()))
}

/// Init timeout of the failure cases.
const INIT_LIMIT: Duration = Duration::from_millis(500);

/// Every result failed, none with a panic, within the bound; returns the failures.
fn all_failed_in_time(
    what: &str,
    results: &[unihal_hal::Result<()>],
    took: Duration,
) -> CaseResult {
    ensure!(
        results.iter().all(|r| r.is_err()),
        "{what}: a communicator was made: {results:?}"
    );
    ensure!(
        !results
            .iter()
            .any(|r| matches!(r, Err(HalError::Internal(_)))),
        "{what}: {results:?}"
    );
    ensure!(
        took < INIT_LIMIT + Duration::from_secs(5),
        "{what}: the init with a timeout of {INIT_LIMIT:?} took {took:?}"
    );
    Ok(())
}

/// A rank given another id than its peers (a fresh one, or bytes no engine made) never joins
/// them: every rank fails with `Timeout` or a typed error within the timeout, never hangs.
fn init_rank_wrong_id(ctx: &Ctx) -> CaseResult {
    let ccl = engine(ctx)?;
    let cfg = CommConfig {
        timeout: Some(INIT_LIMIT),
    };
    let good = ccl.unique_id()?;
    let other = ccl.unique_id()?;
    ensure!(good != other, "two unique_id calls gave the same id");
    let (results, took) = init_ranks_with(ctx, &[good.clone(), other], 2, &cfg)?;
    all_failed_in_time("ranks with different ids", &results, took)?;
    let mut garbage = good.0.clone();
    garbage.iter_mut().for_each(|b| *b ^= 0x5a);
    let (results, took) = init_ranks_with(ctx, &[good, unihal_hal::UniqueId(garbage)], 2, &cfg)?;
    all_failed_in_time("a rank with a corrupted id", &results, took)
}

/// An id makes one communicator: calling `init_rank` again with a spent id fails (a typed
/// error or `Timeout`, as NCCL's bootstrap root is gone) within the timeout, never a second
/// communicator and never a hang.
fn init_rank_stale_id(ctx: &Ctx) -> CaseResult {
    let ccl = engine(ctx)?;
    let id = ccl.unique_id()?;
    let (first, _) = init_ranks_with(ctx, &[id.clone(), id.clone()], 2, &config())?;
    ensure!(
        first.iter().all(|r| r.is_ok()),
        "init_rank with a fresh id: {first:?}"
    );
    let cfg = CommConfig {
        timeout: Some(INIT_LIMIT),
    };
    let (again, took) = init_ranks_with(ctx, &[id.clone(), id], 2, &cfg)?;
    all_failed_in_time("init_rank with a spent id", &again, took)
}

/// A rank that never calls `init_rank`: the others fail with `Timeout` within their timeout
/// (naming the missing rank where the engine sees arrivals), never hang.
fn init_rank_missing(ctx: &Ctx) -> CaseResult {
    let ccl = engine(ctx)?;
    let names = ccl.capabilities().names_missing_ranks;
    let cfg = CommConfig {
        timeout: Some(INIT_LIMIT),
    };
    let id = ccl.unique_id()?;
    // Ranks 0 and 1 of 3 call; rank 2 never does.
    let (results, took) = init_ranks_with(ctx, &[id.clone(), id], 3, &cfg)?;
    all_failed_in_time("init without rank 2", &results, took)?;
    for (r, res) in results.iter().enumerate() {
        match res {
            Err(HalError::Timeout { what, .. }) => {
                ensure!(
                    !names || what.contains('2'),
                    "rank {r}: the timeout does not name rank 2: {what}"
                );
            }
            other => {
                return Err(Failure::new(format!(
                    "rank {r} without rank 2: expected Timeout, got {other:?}"
                )))
            }
        }
    }
    ensure!(
        took >= INIT_LIMIT,
        "init without rank 2 failed after {took:?}, before its timeout of {INIT_LIMIT:?}"
    );
    Ok(())
}

/// The devices of `n` ranks in one process: the context's device and the next ones (wrapping).
fn rank_devices(ctx: &Ctx, n: usize) -> unihal_hal::Result<Vec<Arc<dyn Device>>> {
    let total = ctx.backend.probe()?;
    let me = ctx.device.id().ordinal as usize;
    (0..n).map(|i| ctx.backend.open((me + i) % total)).collect()
}

/// The backend's collective engine.
fn engine(ctx: &Ctx) -> unihal_hal::Result<&dyn unihal_hal::Collectives> {
    ctx.backend
        .collectives()
        .ok_or_else(|| HalError::unsupported("collectives"))
}

/// The first failing rank's failure, named by rank.
fn first_failure(results: Vec<CaseResult>) -> CaseResult {
    for (r, res) in results.into_iter().enumerate() {
        if let Err(f) = res {
            return Err(Failure::new(format!("rank {r}: {}", f.message)));
        }
    }
    Ok(())
}

/// Every process of an SPMD world learns whether any failed (a sum over the world).
fn agree(world: &Arc<dyn Communicator>, mine: CaseResult) -> CaseResult {
    if let Err(f) = &mine {
        // One write, so lines of concurrent ranks do not interleave under mpirun.
        let line = format!("[rank {}] {}\n", world.rank(), f.message);
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
    let s = world.device().create_stream()?;
    let flag = upload(
        world.device(),
        &s,
        DType::I32,
        &[mine.is_err() as i32 as f64],
        0,
    )?;
    world.all_reduce(&flag, &flag, 1, DType::I32, ReduceOp::Sum, &s)?;
    let failed = download(&s, DType::I32, &flag)?[0];
    match mine {
        Err(f) => Err(f),
        Ok(()) if failed > 0.0 => Err(Failure::new(format!(
            "{failed} other rank(s) failed (their messages are on their own output)"
        ))),
        Ok(()) => Ok(()),
    }
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

/// The reductions of `op` that the engine claims for `d` (`[None]` for ops without one).
/// The reductions a case of `op` in `d` runs: `[None]` for an operation that does not reduce,
/// else every reduction the capabilities claim for `d`.
///
/// # Errors
/// A capability inconsistency: `op` is listed in `d` but no reduction is (the case would loop
/// zero times and pass without running anything).
pub(crate) fn reductions(
    caps: &CclCaps,
    op: CollectiveOp,
    d: DType,
) -> Result<Vec<Option<ReduceOp>>, Failure> {
    if !op.reduces() {
        return Ok(vec![None]);
    }
    let reds: Vec<_> = ReduceOp::ALL
        .iter()
        .filter(|&&r| caps.supports(op, d, Some(r)))
        .map(|&r| Some(r))
        .collect();
    if reds.is_empty() {
        return Err(Failure::new(format!(
            "capability inconsistency: {} lists {} in {d} but no reduction of {d} (reductions: \
             {:?})",
            caps.engine,
            op.name(),
            caps.reductions.get(&d)
        )));
    }
    Ok(reds)
}

/// Runs `op` on `n` ranks for every claimed reduction, count and placement.
fn run_op(ctx: &Ctx, op: CollectiveOp, d: DType, n: usize) -> CaseResult {
    let caps = engine(ctx)?.capabilities().clone();
    let reds = reductions(&caps, op, d)?;
    on_ranks(ctx, n, &config(), |rk| {
        for &red in &reds {
            for count in COUNTS {
                for in_place in [false, true] {
                    if in_place && matches!(op, CollectiveOp::AllToAll | CollectiveOp::SendRecv) {
                        continue;
                    }
                    run_one(rk, op, d, n, red, count, in_place)?;
                }
            }
        }
        Ok(())
    })
}

/// One call of `op` on this rank, checked against the reference.
fn run_one(
    rk: &Rank,
    op: CollectiveOp,
    d: DType,
    n: usize,
    red: Option<ReduceOp>,
    count: u64,
    in_place: bool,
) -> CaseResult {
    let (r, nu, esz) = (rk.comm.rank(), n as u64, d.size() as u64);
    let (c, s) = (&rk.comm, &rk.stream);
    let root = (count as usize + 1) % n;
    let what = format!(
        "{} {d} {} ranks {n} count {count}{}",
        op.name(),
        red.map_or(String::new(), |r| r.name().into()),
        if in_place { " in place" } else { "" }
    );
    let send_elems = match op {
        CollectiveOp::ReduceScatter | CollectiveOp::AllToAll => nu * count,
        _ => count,
    };
    let recv_elems = match op {
        CollectiveOp::AllGather | CollectiveOp::AllToAll => nu * count,
        _ => count,
    };
    // Every rank's send contents (the reference needs them all).
    let sends: Vec<Vec<f64>> = (0..n)
        .map(|q| (0..send_elems).map(|i| value(red, d, n, q, i)).collect())
        .collect();
    let (sb, rb) = if in_place && op == CollectiveOp::ReduceScatter {
        // The recv lies inside send, at this rank's block.
        let sb = upload(&rk.device, s, d, &sends[r], 0)?;
        let rb = sb.slice(r as u64 * count * esz, count * esz)?;
        (sb, rb)
    } else if in_place {
        // The send lies inside recv where each op expects it.
        let mut image = vec![0.0; recv_elems as usize];
        let at = if op == CollectiveOp::AllGather {
            r as u64 * count
        } else {
            0
        };
        image[at as usize..(at + send_elems) as usize].copy_from_slice(&sends[r]);
        let rb = upload(&rk.device, s, d, &image, 0)?;
        (rb.slice(at * esz, send_elems * esz)?, rb)
    } else {
        (
            upload(&rk.device, s, d, &sends[r], 0)?,
            upload(&rk.device, s, d, &vec![0.0; recv_elems as usize], 3)?,
        )
    };
    match op {
        CollectiveOp::AllReduce => c.all_reduce(&sb, &rb, count, d, red.unwrap(), s)?,
        CollectiveOp::Broadcast => c.broadcast(&sb, &rb, count, d, root, s)?,
        CollectiveOp::Reduce => c.reduce(&sb, &rb, count, d, red.unwrap(), root, s)?,
        CollectiveOp::AllGather => c.all_gather(&sb, &rb, count, d, s)?,
        CollectiveOp::ReduceScatter => c.reduce_scatter(&sb, &rb, count, d, red.unwrap(), s)?,
        CollectiveOp::AllToAll => c.all_to_all(&sb, &rb, count, d, s)?,
        CollectiveOp::SendRecv => {
            // A ring in one group: send to the next rank, receive from the previous one.
            c.group(
                &[
                    GroupCall::Send {
                        buf: sb.clone(),
                        count,
                        dtype: d,
                        peer: (r + 1) % n,
                    },
                    GroupCall::Recv {
                        buf: rb.clone(),
                        count,
                        dtype: d,
                        peer: (r + n - 1) % n,
                    },
                ],
                s,
            )?;
        }
    }
    s.synchronize()?;
    let got = download(s, d, &rb)?;
    let got = &got[..recv_elems as usize];
    let reduced = |at: u64| -> Vec<f64> {
        (0..count)
            .map(|i| {
                let vals: Vec<f64> = sends.iter().map(|v| v[(at + i) as usize]).collect();
                reduce_ref(red.unwrap(), &vals)
            })
            .collect()
    };
    let want: Vec<f64> = match op {
        CollectiveOp::AllReduce => reduced(0),
        CollectiveOp::Reduce if r == root => reduced(0),
        CollectiveOp::Reduce if in_place => sends[r].clone(),
        CollectiveOp::Reduce => vec![0.0; count as usize],
        CollectiveOp::Broadcast => sends[root].clone(),
        CollectiveOp::AllGather => sends.iter().flatten().cloned().collect(),
        CollectiveOp::ReduceScatter => reduced(r as u64 * count),
        CollectiveOp::AllToAll => (0..n)
            .flat_map(|j| {
                sends[j][(r as u64 * count) as usize..((r as u64 + 1) * count) as usize].to_vec()
            })
            .collect(),
        CollectiveOp::SendRecv => sends[(r + n - 1) % n].clone(),
    };
    let want: Vec<f64> = want.iter().map(|&v| decode(d, &encode(d, v))).collect();
    check_vals(&what, got, &want)?;
    if op == CollectiveOp::SendRecv && n > 1 {
        ordered_pairs(rk, d, n, count)?;
    }
    Ok(())
}

/// Plain (ungrouped) send and recv between partners `2k` and `2k+1`, the even rank sending first,
/// the odd rank receiving first, so stream order alone matches them.
fn ordered_pairs(rk: &Rank, d: DType, n: usize, count: u64) -> CaseResult {
    let r = rk.comm.rank();
    let partner = r ^ 1;
    if partner >= n {
        return Ok(());
    }
    let (c, s) = (&rk.comm, &rk.stream);
    let mine: Vec<f64> = (0..count).map(|i| value(None, d, n, r, i)).collect();
    let theirs: Vec<f64> = (0..count).map(|i| value(None, d, n, partner, i)).collect();
    let sb = upload(&rk.device, s, d, &mine, 0)?;
    let rb = upload(&rk.device, s, d, &vec![0.0; count as usize], 0)?;
    if r % 2 == 0 {
        c.send(&sb, count, d, partner, s)?;
        c.recv(&rb, count, d, partner, s)?;
    } else {
        c.recv(&rb, count, d, partner, s)?;
        c.send(&sb, count, d, partner, s)?;
    }
    s.synchronize()?;
    let want: Vec<f64> = theirs.iter().map(|&v| decode(d, &encode(d, v))).collect();
    check_vals(
        &format!("ordered send/recv {d} count {count} with rank {partner}"),
        &download(s, d, &rb)?,
        &want,
    )
}

/// Elements rank `src` sends to rank `dst` in the all-to-all-v cases (0 included).
fn v_count(base: u64, src: usize, dst: usize) -> u64 {
    if base == 0 {
        0
    } else {
        base + ((src + 2 * dst) % 3) as u64 - 1
    }
}

/// Element `i` of the block `src` sends to `dst`: small integers, exact in every dtype.
fn v_value(src: usize, dst: usize, i: u64) -> f64 {
    ((src as u64 * 31 + dst as u64 * 7 + i) % 100) as f64
}

/// Packed layout with one spare element between blocks: (counts, displacements, total).
fn v_layout(counts: Vec<u64>) -> (Vec<u64>, Vec<u64>, u64) {
    let mut displs = Vec::with_capacity(counts.len());
    let mut at = 0;
    for &c in &counts {
        displs.push(at);
        at += c + 1;
    }
    (counts, displs, at)
}

fn all_to_allv(ctx: &Ctx, d: DType, n: usize) -> CaseResult {
    on_ranks(ctx, n, &config(), |rk| {
        let (r, s) = (rk.comm.rank(), &rk.stream);
        for base in [0u64, 1, 2, 517] {
            let (sc, sd, stotal) = v_layout((0..n).map(|j| v_count(base, r, j)).collect());
            let (rc, rd, rtotal) = v_layout((0..n).map(|j| v_count(base, j, r)).collect());
            let mut image = vec![0.0; stotal as usize];
            for j in 0..n {
                for i in 0..sc[j] {
                    image[(sd[j] + i) as usize] = v_value(r, j, i);
                }
            }
            let sb = upload(&rk.device, s, d, &image, 0)?;
            let rb = upload(&rk.device, s, d, &vec![0.0; rtotal as usize], 0)?;
            rk.comm.all_to_allv(&sb, &sc, &sd, &rb, &rc, &rd, d, s)?;
            s.synchronize()?;
            let mut want = vec![0.0; rtotal as usize];
            for j in 0..n {
                for i in 0..rc[j] {
                    want[(rd[j] + i) as usize] = v_value(j, r, i);
                }
            }
            check_vals(
                &format!("all_to_allv {d} ranks {n} base {base}"),
                &download(s, d, &rb)?,
                &want,
            )?;
        }
        Ok(())
    })
}

/// Splits `n` ranks by parity with keys reversing the order (and one rank opting out when n > 2),
/// then checks each child's size, rank order and an all_reduce inside it.
fn split(ctx: &Ctx, n: usize) -> CaseResult {
    on_ranks(ctx, n, &config(), |rk| {
        let r = rk.comm.rank();
        let out = n > 2 && r == n - 1;
        let color = (!out).then_some((r % 2) as u32);
        let child = rk.comm.split(color, -(r as i32), &config())?;
        let s = &rk.stream;
        match child {
            None => {
                ensure!(out, "rank {r} got no communicator for color {color:?}");
            }
            Some(child) => {
                ensure!(!out, "rank {r} opted out but got a communicator");
                let members: Vec<usize> = (0..n)
                    .rev()
                    .filter(|&q| q % 2 == r % 2 && !(n > 2 && q == n - 1))
                    .collect();
                ensure_eq!(child.size(), members.len(), "size of color {}", r % 2);
                let want_rank = members.iter().position(|&q| q == r).unwrap();
                ensure_eq!(
                    child.rank(),
                    want_rank,
                    "rank of old rank {r} (keys reverse the order)"
                );
                ensure!(
                    child.device().id() == rk.device.id(),
                    "the child moved to another device"
                );
                let b = upload(&rk.device, s, DType::I32, &[r as f64 + 1.0; 5], 0)?;
                child.all_reduce(&b, &b, 5, DType::I32, ReduceOp::Sum, s)?;
                s.synchronize()?;
                let sum: f64 = members.iter().map(|&q| q as f64 + 1.0).sum();
                check_vals(
                    "all_reduce in the split child",
                    &download(s, DType::I32, &b)?,
                    &[sum; 5],
                )?;
            }
        }
        // The parent still works after the split, for every rank.
        let p = upload(&rk.device, s, DType::I32, &[1.0], 0)?;
        rk.comm
            .all_reduce(&p, &p, 1, DType::I32, ReduceOp::Sum, s)?;
        s.synchronize()?;
        check_vals(
            "parent all_reduce after split",
            &download(s, DType::I32, &p)?,
            &[n as f64],
        )
    })
}

fn misuse(ctx: &Ctx) -> CaseResult {
    let other_device = ctx.other_device()?;
    on_ranks(ctx, 2, &config(), |rk| {
        let (c, s) = (&rk.comm, &rk.stream);
        let b = rk.device.alloc(64)?;
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
        if other_device.id() != rk.device.id() {
            let other = other_device.alloc(64)?;
            let r = expect_invalid(
                c.all_reduce(&other, &b, 4, DType::F32, ReduceOp::Sum, s),
                "send",
            )?;
            ensure!(
                matches!(r, Invalid::WrongDevice { .. }),
                "buffer of another device: {r:?}"
            );
            let r = expect_invalid(
                c.all_reduce(
                    &b,
                    &b,
                    4,
                    DType::F32,
                    ReduceOp::Sum,
                    &other_device.create_stream()?,
                ),
                "stream",
            )?;
            ensure!(
                matches!(r, Invalid::WrongDevice { .. }),
                "stream of another device: {r:?}"
            );
        }
        let r = expect_invalid(
            c.all_to_allv(
                &b,
                &[1],
                &[0, 0],
                &rk.device.alloc(64)?,
                &[1, 1],
                &[0, 1],
                DType::F32,
                s,
            ),
            "send_counts",
        )?;
        ensure!(
            matches!(r, Invalid::Value { .. }),
            "all_to_allv with one count for two ranks: {r:?}"
        );
        let r = expect_invalid(
            c.all_to_allv(&b, &[1, 1], &[0, 1], &b, &[1, 1], &[2, 3], DType::F32, s),
            "recv",
        )?;
        ensure!(
            matches!(r, Invalid::Other(_)),
            "all_to_allv in place: {r:?}"
        );
        let engine = engine(ctx)?.capabilities().clone();
        let bool_sum = c.all_reduce(&b, &b, 4, DType::Bool, ReduceOp::Sum, s);
        if engine.supports(CollectiveOp::AllReduce, DType::Bool, Some(ReduceOp::Sum)) {
            bool_sum.map_err(|e| Failure::new(format!("claimed bool sum failed: {e}")))?;
            s.synchronize()?;
        } else {
            ensure!(
                matches!(bool_sum, Err(HalError::Unsupported { .. })),
                "sum of bool outside the capabilities gave {bool_sum:?}"
            );
        }
        ensure!(c.async_error().is_none(), "rejected calls left an error");
        Ok(())
    })
}

fn mismatched(ctx: &Ctx) -> CaseResult {
    let cfg = CommConfig {
        timeout: Some(Duration::from_secs(5)),
    };
    // On engines where a failing rank stops its peers (NCCL-style libraries that cannot abort
    // one rank alone), the rank that detects the mismatch second may already have been stopped
    // by the first: `Aborted`, naming the other rank's failure.
    let caps = ctx.backend.collectives().map(|c| c.capabilities().clone());
    let peers_abort = caps.as_ref().is_some_and(|c| c.timeout_aborts_peers);
    on_ranks(ctx, 2, &cfg, |rk| {
        let r = rk.comm.rank();
        let b = rk.device.alloc(64)?;
        let count = 4 * (r as u64 + 1);
        // On a device whose faults poison it, the fault may already surface from the call.
        let res = rk
            .comm
            .all_reduce(&b, &b, count, DType::F32, ReduceOp::Sum, &rk.stream)
            .and_then(|()| rk.stream.synchronize());
        match res {
            Err(HalError::InvalidArgument { .. }) | Err(HalError::Timeout { .. }) => Ok(()),
            Err(HalError::Aborted { what }) if peers_abort && what.contains("failed") => Ok(()),
            // A device that detects the mismatch in its kernels reports a fault (and is poisoned:
            // the case is isolated there).
            Err(HalError::Vendor { .. })
                if rk.device.capabilities().optional.fault_poisons_device =>
            {
                Ok(())
            }
            other => Err(Failure::new(format!(
                "rank {r} after mismatched counts: {other:?}"
            ))),
        }
    })
}

/// Whether an engine's message names rank 2, alone ("rank 2", "[2]") or in a list of ranks
/// ("ranks [1, 2]": on a loaded machine a peer may still be on its way when this rank's deadline
/// passes, and a peer may time out and leave before this rank notices rank 2).
fn names_rank_2(what: &str) -> bool {
    let in_list = what.split('[').skip(1).any(|rest| {
        rest.split(']')
            .next()
            .is_some_and(|list| list.split(',').any(|r| r.trim() == "2"))
    });
    in_list || what.contains("rank 2")
}

/// Whether an `Aborted` message names rank 2 among the ranks that left.
fn left_named(what: &str) -> bool {
    names_rank_2(what) && what.contains("left")
}

fn missing_rank(ctx: &Ctx) -> CaseResult {
    let caps = ctx.backend.collectives().map(|c| c.capabilities().clone());
    let names = caps.as_ref().is_some_and(|c| c.names_missing_ranks);
    // On engines whose timeout aborts the communicator (NCCL), the first rank to time out may fail
    // the other waiting rank with `Aborted` just before its own deadline.
    let peers_abort = caps.as_ref().is_some_and(|c| c.timeout_aborts_peers);
    let limit = Duration::from_millis(300);
    let cfg = CommConfig {
        timeout: Some(limit),
    };
    on_ranks(ctx, 3, &cfg, |rk| {
        let r = rk.comm.rank();
        if r == 2 {
            // Rank 2 never calls.
            return Ok(());
        }
        let t0 = Instant::now();
        let mut gone = false;
        let b = rk.device.alloc(64)?;
        rk.comm
            .all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &rk.stream)?;
        match rk.stream.synchronize() {
            Err(HalError::Timeout { what, .. }) => {
                ensure!(
                    !names || names_rank_2(&what),
                    "rank {r}: timeout does not name the missing rank: {what}"
                );
            }
            Err(HalError::Aborted { .. }) if peers_abort => {}
            // Engines that see a rank leave (its connections break when its communicator is
            // destroyed: gloo) fail at once, naming the rank that left.
            Err(HalError::Aborted { what }) if left_named(&what) => gone = true,
            other => return Err(Failure::new(format!("rank {r} without rank 2: {other:?}"))),
        }
        let el = t0.elapsed();
        ensure!(
            match rk.comm.async_error() {
                Some(HalError::Timeout { .. }) => true,
                Some(HalError::Aborted { .. }) => peers_abort || gone,
                _ => false,
            },
            "rank {r}: no sticky communicator error"
        );
        ensure!(
            el < limit + Duration::from_millis(1500),
            "rank {r}: the timeout of {limit:?} took {el:?}"
        );
        ensure!(
            el >= limit || peers_abort || gone,
            "rank {r}: failed after {el:?}, before the timeout of {limit:?}"
        );
        Ok(())
    })
}

fn abort_unblocks(ctx: &Ctx) -> CaseResult {
    let cfg = CommConfig {
        timeout: Some(Duration::from_secs(30)),
    };
    on_ranks(ctx, 2, &cfg, |rk| {
        if rk.comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(50));
            rk.comm.abort();
            ensure!(
                matches!(rk.comm.async_error(), Some(HalError::Aborted { .. })),
                "no sticky error on the aborting rank"
            );
            return Ok(());
        }
        let b = rk.device.alloc(64)?;
        let t0 = Instant::now();
        rk.comm
            .all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &rk.stream)?;
        let r = rk.stream.synchronize();
        ensure!(
            matches!(r, Err(HalError::Aborted { .. })),
            "pending op after the peer's abort: {r:?}"
        );
        ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "abort took {:?} to unblock",
            t0.elapsed()
        );
        let again = rk
            .comm
            .all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &rk.stream);
        ensure!(again.is_err(), "an aborted communicator accepted new work");
        Ok(())
    })
}

/// Sizes that overflow and send/recv views that partially overlap are rejected at the call (a
/// partial overlap would let one rank's writes race with its peers' reads); exact in-place views
/// stay legal (the op cases run them).
fn overlap_and_overflow(ctx: &Ctx) -> CaseResult {
    on_ranks(ctx, 2, &config(), |rk| {
        let (c, s) = (&rk.comm, &rk.stream);
        let (b, b2) = (rk.device.alloc(256)?, rk.device.alloc(256)?);
        let (lo, hi, mid) = (b.slice(0, 128)?, b.slice(64, 128)?, b.slice(32, 64)?);
        for (what, r) in [
            (
                "all_reduce",
                c.all_reduce(&lo, &hi, 32, DType::F32, ReduceOp::Sum, s),
            ),
            (
                "reduce",
                // Each rank its own root: only the root's recv is used, and both calls are
                // rejected before anything is enqueued.
                c.reduce(&lo, &hi, 32, DType::F32, ReduceOp::Sum, c.rank(), s),
            ),
            // Off every rank's in-place position (rank * 64 bytes): overlapping on both ranks.
            ("all_gather", c.all_gather(&mid, &b, 16, DType::F32, s)),
            (
                "reduce_scatter",
                c.reduce_scatter(&b, &mid, 16, DType::F32, ReduceOp::Sum, s),
            ),
        ] {
            ensure!(
                matches!(expect_invalid(r, "recv")?, Invalid::Overlap { .. }),
                "{what} with partially overlapping send and recv"
            );
        }
        for (what, r) in [
            (
                "all_reduce",
                c.all_reduce(&b, &b, u64::MAX / 2, DType::F32, ReduceOp::Sum, s),
            ),
            (
                "all_gather",
                c.all_gather(&b, &b, u64::MAX / 4, DType::U8, s),
            ),
            (
                "all_to_all",
                c.all_to_all(&b, &b2, u64::MAX / 2, DType::U8, s),
            ),
            (
                "send",
                c.send(&b, u64::MAX / 2, DType::F64, 1 - c.rank(), s),
            ),
        ] {
            ensure!(
                matches!(r, Err(HalError::InvalidArgument { .. })),
                "{what} with a count whose size overflows: {r:?}"
            );
        }
        s.synchronize()?;
        ensure!(c.async_error().is_none(), "rejected calls left an error");
        Ok(())
    })
}

/// `init_all` with one device twice is rejected (two ranks on one device share its streams and
/// memory; NCCL rejects it too).
fn device_twice(ctx: &Ctx) -> CaseResult {
    let ccl = engine(ctx)?;
    let r = ccl.init_all(&[ctx.device.clone(), ctx.device.clone()], &config());
    match r {
        Err(HalError::InvalidArgument { arg, .. }) => {
            ensure_eq!(arg, "devices", "the argument named");
            Ok(())
        }
        other => Err(Failure::new(format!(
            "init_all with one device twice: {:?}",
            other.map(|v| v.len())
        ))),
    }
}

/// One rank per device per communicator, also when ranks join by id from their own threads (as
/// `init_all` refuses a device twice): two `init_rank` calls of one id on one device are refused
/// (typed, at once for at least one of them), and no communicator is made. A collective between
/// two ranks of one device would read and write one range as two.
fn device_twice_by_rank(ctx: &Ctx) -> CaseResult {
    let ccl = engine(ctx)?;
    let id = ccl.unique_id()?;
    let cfg = CommConfig {
        timeout: Some(Duration::from_millis(500)),
    };
    let t0 = Instant::now();
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (id, cfg) = (&id, &cfg);
                sc.spawn(move || ccl.init_rank(id, 2, r, &ctx.device, cfg).map(drop))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(HalError::Internal("panicked".into())))
            })
            .collect()
    });
    ensure!(
        results.iter().all(|r| r.is_err()),
        "a communicator with two ranks on {} was made: {results:?}",
        ctx.device.id()
    );
    ensure!(
        results.iter().any(|r| matches!(
            r,
            Err(HalError::InvalidArgument { .. }) | Err(HalError::Vendor { .. })
        )),
        "two ranks on one device were not refused as such: {results:?}"
    );
    ensure!(
        t0.elapsed() < Duration::from_secs(10),
        "init_rank with two ranks on one device took {:?}",
        t0.elapsed()
    );
    Ok(())
}

/// An id of another length than the engine's `unique_id` (empty, truncated, one byte more, a
/// megabyte: a hostile or garbled bootstrap message) is `InvalidArgument` naming `id`, at once:
/// never a read past the id, a panic, or a wait for peers.
fn wrong_length_id(ctx: &Ctx) -> CaseResult {
    let ccl = engine(ctx)?;
    let good = ccl.unique_id()?.0;
    let cfg = CommConfig {
        timeout: Some(Duration::from_secs(30)),
    };
    let mut longer = good.clone();
    longer.push(0);
    for (what, bytes) in [
        ("empty", Vec::new()),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("one byte longer", longer),
        ("a megabyte", vec![0x5a; 1 << 20]),
    ] {
        let t0 = Instant::now();
        let r = ccl.init_rank(&unihal_hal::UniqueId(bytes), 2, 0, &ctx.device, &cfg);
        match r {
            Err(HalError::InvalidArgument { arg, .. }) => ensure_eq!(arg, "id", "{what}"),
            other => {
                return Err(Failure::new(format!(
                    "init_rank with a {what} id: {:?}",
                    other.map(|c| c.size())
                )))
            }
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "init_rank with a {what} id took {:?} to refuse it",
            t0.elapsed()
        );
    }
    Ok(())
}

/// Two `init_rank` calls that claim the same rank of one id: one is rejected, and neither hangs
/// (the communicator can never complete, so the other times out).
fn duplicate_rank(ctx: &Ctx) -> CaseResult {
    let ccl = engine(ctx)?;
    let other = ctx.other_device()?;
    let id = ccl.unique_id()?;
    let cfg = CommConfig {
        timeout: Some(Duration::from_millis(500)),
    };
    let t0 = Instant::now();
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = [ctx.device.clone(), other]
            .into_iter()
            .map(|d| {
                let (id, cfg) = (&id, &cfg);
                sc.spawn(move || ccl.init_rank(id, 2, 0, &d, cfg).map(drop))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(HalError::Internal("panicked".into())))
            })
            .collect()
    });
    let rejected = results
        .iter()
        .filter(|r| {
            matches!(
                r,
                Err(HalError::InvalidArgument { .. }) | Err(HalError::Vendor { .. })
            )
        })
        .count();
    ensure!(rejected >= 1, "two init_rank calls for rank 0: {results:?}");
    ensure!(
        results.iter().all(|r| r.is_err()),
        "a communicator with a duplicate rank was made: {results:?}"
    );
    ensure!(
        t0.elapsed() < Duration::from_secs(10),
        "init_rank with a duplicate rank took {:?}",
        t0.elapsed()
    );
    Ok(())
}

/// Collectives over caching-allocator blocks keep the blocks their caller's: an engine's own
/// views of them (the default `all_to_allv` slices its buffers, an emulated average divides in
/// place) must not hand them back to the allocator, so afterwards both blocks are still
/// allocated, a new block does not overlap them, and the results survive writes to it.
fn blocks_kept(ctx: &Ctx, alltoallv: bool) -> CaseResult {
    let caps = engine(ctx)?.capabilities().clone();
    on_ranks(ctx, 2, &config(), |rk| {
        let (r, s) = (rk.comm.rank(), &rk.stream);
        let a = unihal_alloc::CachingAllocator::new(rk.device.clone(), Default::default())?;
        let d = DType::F32;
        let count = 256u64;
        let bytes = (count * 4) as usize;
        let sends: Vec<Vec<f64>> = (0..2)
            .map(|q| (0..count).map(|i| (q * 1000) as f64 + i as f64).collect())
            .collect();
        let image = |q: usize| -> Vec<u8> { sends[q].iter().flat_map(|&v| encode(d, v)).collect() };
        let send = a.alloc(s, bytes)?;
        let recv = a.alloc(s, bytes)?;
        let want: Vec<f64> = if alltoallv {
            // Half to each rank: block j of rank r's result is rank j's half r.
            let (counts, displs) = ([128u64, 128], [0u64, 128]);
            s.write(&send, 0, &image(r))?;
            rk.comm
                .all_to_allv(&send, &counts, &displs, &recv, &counts, &displs, d, s)?;
            (0..count as usize)
                .map(|i| sends[i / 128][128 * r + i % 128])
                .collect()
        } else {
            let reds = reductions(&caps, CollectiveOp::AllReduce, d)?;
            let mut want = Vec::new();
            for red in reds.into_iter().flatten() {
                s.write(&send, 0, &image(r))?;
                rk.comm.all_reduce(&send, &recv, count, d, red, s)?;
                s.synchronize()?;
                want = (0..count as usize)
                    .map(|i| reduce_ref(red, &[sends[0][i], sends[1][i]]))
                    .collect();
                check_vals(
                    &format!("all_reduce {} over blocks", red.name()),
                    &download(s, d, &recv)?,
                    &want,
                )?;
            }
            want
        };
        s.synchronize()?;
        ensure_eq!(
            a.stats().allocation.all.current,
            2,
            "rank {r}: allocator blocks still held after the collective"
        );
        let fresh = a.alloc(s, bytes)?;
        for (name, b) in [("send", &send), ("recv", &recv)] {
            let (x, y) = (b.device_addr(), fresh.device_addr());
            ensure!(
                y + bytes as u64 <= x || x + bytes as u64 <= y,
                "rank {r}: a new block overlaps the {name} block the collective ran on"
            );
        }
        s.fill(&fresh, 0, bytes as u64, unihal_hal::FillValue::U8(0xEE))?;
        s.synchronize()?;
        check_vals(
            &format!("rank {r}: the result after a new block was written"),
            &download(s, d, &recv)?,
            &want,
        )
    })
}

/// The collective cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let all_reduce = Need::Collective(CollectiveOp::AllReduce, DType::F32);
    for op in CollectiveOp::ALL {
        for d in DTYPES {
            for n in 1..=4usize {
                let mut needs = vec![Need::Ranks(n), Need::Collective(op, d)];
                if op == CollectiveOp::SendRecv {
                    needs.push(Need::CclGroups);
                }
                v.push(
                    Case::new(
                        format!("ccl.{}.{}.ranks{n}", op.name(), d.name()),
                        move |c| run_op(c, op, d, n),
                    )
                    .needs(&needs),
                );
            }
        }
    }
    for d in DTYPES {
        for n in 1..=4usize {
            v.push(
                Case::new(format!("ccl.all_to_allv.{}.ranks{n}", d.name()), move |c| {
                    all_to_allv(c, d, n)
                })
                .needs(&[
                    Need::Ranks(n),
                    Need::Collective(CollectiveOp::SendRecv, d),
                    Need::CclGroups,
                ]),
            );
        }
    }
    for n in 2..=4usize {
        v.push(
            Case::new(format!("ccl.split.parity.ranks{n}"), move |c| split(c, n)).needs(&[
                Need::Ranks(n),
                Need::CclSplit,
                all_reduce,
            ]),
        );
    }
    for n in 1..=4usize {
        v.push(
            Case::new(format!("ccl.init_rank.ranks{n}"), move |c| {
                init_rank_works(c, n)
            })
            .needs(&[
                Need::Ranks(n),
                Need::WholeWorld(n),
                all_reduce,
                Need::Collective(CollectiveOp::Broadcast, DType::I32),
            ]),
        );
    }
    for (id, f) in [
        (
            "ccl.init_rank.wrong_id",
            init_rank_wrong_id as fn(&Ctx) -> CaseResult,
        ),
        ("ccl.init_rank.stale_id", init_rank_stale_id),
    ] {
        v.push(Case::new(id, f).needs(&[Need::InProcess, Need::Devices(2), all_reduce]));
    }
    v.push(
        Case::new("ccl.init_rank.rank_never_arrives", init_rank_missing).needs(&[
            Need::InProcess,
            Need::Devices(2),
            all_reduce,
        ]),
    );
    v.push(Case::new("ccl.misuse.invalid_arguments", misuse).needs(&[
        Need::Ranks(2),
        all_reduce,
        Need::Collective(CollectiveOp::SendRecv, DType::F32),
    ]));
    v.push(
        Case::new("ccl.misuse.overlap_and_overflow", overlap_and_overflow).needs(&[
            Need::Ranks(2),
            all_reduce,
            Need::Collective(CollectiveOp::Reduce, DType::F32),
            Need::Collective(CollectiveOp::AllGather, DType::F32),
            Need::Collective(CollectiveOp::ReduceScatter, DType::F32),
            Need::Collective(CollectiveOp::AllToAll, DType::U8),
            Need::Collective(CollectiveOp::AllGather, DType::U8),
            Need::Collective(CollectiveOp::SendRecv, DType::F64),
        ]),
    );
    v.push(
        Case::new("ccl.blocks.all_reduce_keeps_them", |c| {
            blocks_kept(c, false)
        })
        .needs(&[Need::Ranks(2), all_reduce]),
    );
    v.push(
        Case::new("ccl.blocks.all_to_allv_keeps_them", |c| {
            blocks_kept(c, true)
        })
        .needs(&[
            Need::Ranks(2),
            Need::Collective(CollectiveOp::SendRecv, DType::F32),
            Need::CclGroups,
        ]),
    );
    v.push(
        Case::new("ccl.misuse.init_rank_device_twice", device_twice_by_rank)
            .needs(&[Need::InProcess, all_reduce]),
    );
    v.push(
        Case::new("ccl.misuse.init_all_device_twice", device_twice)
            .needs(&[Need::InProcess, all_reduce]),
    );
    v.push(
        Case::new("ccl.misuse.unique_id_of_wrong_length", wrong_length_id)
            .needs(&[Need::InProcess, all_reduce]),
    );
    v.push(
        Case::new("ccl.misuse.init_rank_duplicate_rank", duplicate_rank).needs(&[
            Need::InProcess,
            Need::Devices(2),
            all_reduce,
        ]),
    );
    v.push(
        Case::new("ccl.misuse.mismatched_counts", mismatched)
            .needs(&[Need::Ranks(2), all_reduce])
            .faulting(),
    );
    v.push(
        Case::new("ccl.failure.missing_rank_times_out", missing_rank)
            .needs(&[Need::Ranks(3), all_reduce]),
    );
    v.push(
        Case::new("ccl.failure.abort_unblocks", abort_unblocks)
            .needs(&[Need::Ranks(2), all_reduce]),
    );
    v.push(
        Case::new("ccl.config.timeout_extremes", |c| {
            timeout_extremes(c, |c, n, cfg, body| on_ranks(c, n, cfg, body))
        })
        .needs(&[Need::Ranks(2), all_reduce]),
    );
    v.push(
        Case::new("ccl.init_rank.timeout_extremes", |c| {
            timeout_extremes(c, |c, n, cfg, body| on_ranks_by_id(c, n, cfg, body))
        })
        .needs(&[Need::Ranks(2), Need::WholeWorld(2), all_reduce]),
    );
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn caps(reductions: Vec<ReduceOp>) -> CclCaps {
        CclCaps {
            engine: "test engine".into(),
            ops: BTreeMap::from([
                (CollectiveOp::AllReduce, vec![DType::F32]),
                (CollectiveOp::AllGather, vec![DType::F32]),
            ]),
            reductions: BTreeMap::from([(DType::F32, reductions)]),
            accumulation: BTreeMap::new(),
            groups: false,
            split: false,
            survives_dead_rank: true,
            names_missing_ranks: true,
            timeout_aborts_peers: false,
            crosses_processes: false,
        }
    }

    #[test]
    fn a_reducing_op_listed_without_reductions_is_a_capability_inconsistency() {
        let c = caps(Vec::new());
        let e = reductions(&c, CollectiveOp::AllReduce, DType::F32).unwrap_err();
        assert!(
            e.message.contains("capability inconsistency"),
            "{}",
            e.message
        );
        assert!(e.message.contains("test engine"), "{}", e.message);
        // Ops that do not reduce run once, without a reduction.
        assert_eq!(
            reductions(&c, CollectiveOp::AllGather, DType::F32).unwrap(),
            vec![None]
        );
    }

    #[test]
    fn every_claimed_reduction_runs() {
        let c = caps(vec![ReduceOp::Sum, ReduceOp::Max]);
        assert_eq!(
            reductions(&c, CollectiveOp::AllReduce, DType::F32).unwrap(),
            vec![Some(ReduceOp::Sum), Some(ReduceOp::Max)]
        );
    }

    #[test]
    fn a_left_error_names_rank_2_alone_or_in_a_list() {
        assert!(left_named("ranks [1, 2] left before arriving"));
        assert!(left_named("ranks [2] left before arriving"));
        assert!(left_named("rank 2 left"));
        assert!(!left_named("ranks [1, 12] left before arriving"));
        assert!(!left_named("ranks [1] left before arriving"));
        assert!(!left_named("ranks [1, 2] timed out"));
    }

    #[test]
    fn a_timeout_names_rank_2_alone_or_among_late_peers() {
        // Seen under AddressSanitizer on a loaded machine: rank 1 was still on its way.
        assert!(names_rank_2(
            "all_reduce 16 f32 sum (collective #0): waiting for the other ranks; ranks [1, 2] never arrived"
        ));
        assert!(names_rank_2("ranks [2] never arrived"));
        assert!(!names_rank_2("ranks [1] never arrived"));
    }
}
