//! The descriptor API of `libnnopbase` (`aclCreateTensor`, scalars, arrays, tensor lists and
//! their destroy calls) and the operator executors, as `acl_meta.h` and opbase's sources
//! document them (op map A.2, A.3).
//!
//! Stricter than the real library where misuse is undefined there: every descriptor is
//! registered while it lives, so a destroyed (or never created) descriptor passed to an
//! operator, a double destroy, or the destroy of a tensor a tensor list owns is refused with
//! `ACLNN_ERR_PARAM_INVALID` and recorded as a violation (`unihal_sim_violations`), never a
//! use after free. An `aclTensor` cannot express a negative stride or a negative offset:
//! `aclCreateTensor` returns NULL for them (and for a view reaching past its storage shape),
//! with the reason in `aclGetRecentErrMsg`.

use crate::conv::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use unihal_hal::DType;

/// Most dims of an aclnn tensor.
pub const MAX_DIMS: usize = 8;

/// An `aclTensor`: a strided view of device memory, in elements from `data`.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub view: Vec<i64>,
    pub strides: Vec<i64>,
    pub offset: i64,
    /// `aclDataType` as given (checked against the operator's table in phase 1).
    pub dtype: i32,
    pub format: i32,
    pub storage: Vec<i64>,
    /// The storage's base address on the device.
    pub data: u64,
}

impl Tensor {
    /// Elements of the storage shape (saturating: `aclCreateTensor` refuses shapes that
    /// overflow, so a live descriptor never saturates).
    pub fn storage_numel(&self) -> i64 {
        self.storage.iter().fold(1i64, |n, &d| n.saturating_mul(d))
    }

    /// Elements of the view (saturating, as [`Tensor::storage_numel`]).
    pub fn numel(&self) -> i64 {
        self.view.iter().fold(1i64, |n, &d| n.saturating_mul(d))
    }

    /// The unihal dtype.
    ///
    /// # Errors
    /// `ACLNN_ERR_PARAM_INVALID` for a type the simulator does not compute in.
    pub fn dt(&self) -> Result<DType, Err> {
        dtype_of_acl(self.dtype).ok_or_else(|| {
            Err::new(
                ACLNN_ERR_PARAM_INVALID,
                format!("aclDataType {} is not supported", self.dtype),
            )
        })
    }

    /// Byte range `[start, start + len)` of the storage.
    pub fn span(&self) -> (u64, u64) {
        let esize = dtype_of_acl(self.dtype).map_or(1, |d| d.size() as u64);
        (self.data, self.storage_numel().max(0) as u64 * esize)
    }
}

/// An `aclScalar`: the value copied at creation.
#[derive(Debug, Clone, Copy)]
pub struct Scalar {
    pub dtype: i32,
    pub value: unihal_hal::Scalar,
}

/// The kinds of descriptor, for the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tensor,
    Scalar,
    IntArray,
    FloatArray,
    BoolArray,
    TensorList,
    ScalarList,
}

/// A live descriptor: its kind, its serial (an address reused after a free gets a new serial)
/// and, for a tensor in a list, the list that owns it.
#[derive(Debug, Clone, Copy)]
struct Live {
    kind: Kind,
    serial: u64,
    owner: Option<usize>,
}

fn registry() -> &'static Mutex<HashMap<usize, Live>> {
    static R: OnceLock<Mutex<HashMap<usize, Live>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

static SERIAL: AtomicU64 = AtomicU64::new(1);

fn register<T>(b: Box<T>, kind: Kind) -> *mut T {
    let p = Box::into_raw(b);
    registry().lock().insert(
        p as usize,
        Live {
            kind,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            owner: None,
        },
    );
    p
}

/// A descriptor's identity for an executor: phase 2 checks that it is still the same live one.
pub type Dep = (usize, u64);

/// A copy of the live descriptor `p` of `kind`, with its identity. The copy is taken under the
/// registry's lock, which every destroy takes before freeing: a concurrent destroy cannot free
/// the descriptor while it is read.
///
/// # Errors
/// `ACLNN_ERR_PARAM_NULLPTR` for NULL; `ACLNN_ERR_PARAM_INVALID` (and a violation) for a
/// destroyed or foreign pointer.
pub fn get<T: Clone>(p: *const T, kind: Kind, what: &str) -> Result<(T, Dep), Err> {
    if p.is_null() {
        return Err(Err::new(ACLNN_ERR_PARAM_NULLPTR, format!("{what} is NULL")));
    }
    let r = registry().lock();
    match r.get(&(p as usize)).copied() {
        Some(l) if l.kind == kind => {
            // SAFETY: registered, so made by Box::into_raw of a `T` (as the kind says) and not
            // yet freed; destroys remove it from the registry (under this lock) before freeing.
            let v = unsafe { (*p).clone() };
            Ok((v, (p as usize, l.serial)))
        }
        _ => {
            drop(r);
            let msg = format!(
                "{what} ({p:p}) is not a live {kind:?} descriptor (destroyed, or never created)"
            );
            unihal_sim::fault::violation(msg.clone());
            Err(Err::new(ACLNN_ERR_PARAM_INVALID, msg))
        }
    }
}

/// Whether every descriptor of `deps` is still the live one it was.
pub fn alive(deps: &[Dep]) -> bool {
    let r = registry().lock();
    deps.iter()
        .all(|(p, serial)| r.get(p).is_some_and(|l| l.serial == *serial))
}

fn destroy<T>(p: *const T, kind: Kind, name: &str) -> i32 {
    crate::entry(name, ACLNN_ERR_INNER, || {
        if p.is_null() {
            return Ok(());
        }
        let mut r = registry().lock();
        match r.get(&(p as usize)).copied() {
            Some(l) if l.kind == kind && l.owner.is_none() => {
                r.remove(&(p as usize));
                drop(r);
                // SAFETY: made by Box::into_raw of a `T` in `register` and removed from the
                // registry just now, so no other destroy can free it again.
                drop(unsafe { Box::from_raw(p as *mut T) });
                Ok(())
            }
            Some(l) if l.owner.is_some() => {
                let msg = format!("{name}: {p:p} belongs to a tensor list, which destroys it");
                unihal_sim::fault::violation(msg.clone());
                Err(Err::new(ACLNN_ERR_PARAM_INVALID, msg))
            }
            _ => {
                let msg = format!("{name}: {p:p} is not a live {kind:?} (double destroy?)");
                unihal_sim::fault::violation(msg.clone());
                Err(Err::new(ACLNN_ERR_PARAM_INVALID, msg))
            }
        }
    })
}

/// Reads `n` values from a C array (NULL with `n == 0` is an empty array).
///
/// # Safety
/// `p` is valid for `n` reads when not NULL.
unsafe fn array<T: Copy>(p: *const T, n: u64) -> Option<Vec<T>> {
    if n == 0 {
        return Some(Vec::new());
    }
    if p.is_null() || n > (1 << 20) {
        return None;
    }
    // SAFETY: non-null and valid for `n` reads (the caller's contract).
    Some(unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec())
}

fn null_with(msg: String) -> *mut Tensor {
    crate::set_recent(format!("aclCreateTensor: {msg} (simulated CANN)"));
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn aclCreateTensor(
    view_dims: *const i64,
    view_dims_num: u64,
    data_type: i32,
    stride: *const i64,
    offset: i64,
    format: i32,
    storage_dims: *const i64,
    storage_dims_num: u64,
    tensor_data: *mut c_void,
) -> *mut Tensor {
    if view_dims_num as usize > MAX_DIMS || storage_dims_num as usize > MAX_DIMS {
        return null_with(format!("more than {MAX_DIMS} dims"));
    }
    // SAFETY: the caller's arrays of the given lengths.
    let (Some(view), Some(strides), Some(storage)) = (
        unsafe { array(view_dims, view_dims_num) },
        unsafe { array(stride, view_dims_num) },
        unsafe { array(storage_dims, storage_dims_num) },
    ) else {
        return null_with("a NULL dims or strides array with a non-zero count".into());
    };
    if view.iter().chain(&storage).any(|&d| d < 0) {
        return null_with(format!("negative dims in {view:?} / {storage:?}"));
    }
    if strides.iter().any(|&s| s < 0) {
        return null_with(format!(
            "negative strides {strides:?}: an aclTensor cannot express them"
        ));
    }
    if offset < 0 {
        return null_with(format!("negative offset {offset}"));
    }
    // Element counts and byte sizes must fit (a hostile shape is refused, never an overflow).
    let fits = |dims: &[i64]| {
        dims.iter()
            .try_fold(1i64, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(16))
            .is_some()
    };
    if !fits(&view) || !fits(&storage) || offset.checked_mul(16).is_none() {
        return null_with(format!("dims {view:?} / {storage:?} overflow"));
    }
    let t = Tensor {
        view,
        strides,
        offset,
        dtype: data_type,
        format,
        storage,
        data: tensor_data as u64,
    };
    if t.numel() > 0 {
        let reach: i64 = t
            .view
            .iter()
            .zip(&t.strides)
            .map(|(&d, &s)| (d - 1).saturating_mul(s))
            .fold(t.offset, i64::saturating_add);
        if reach >= t.storage_numel() {
            return null_with(format!(
                "the view (dims {:?}, strides {:?}, offset {}) reaches element {reach}, past the storage of {} elements",
                t.view, t.strides, t.offset, t.storage_numel()
            ));
        }
    }
    register(Box::new(t), Kind::Tensor)
}

#[no_mangle]
pub unsafe extern "C" fn aclCreateScalar(value: *mut c_void, data_type: i32) -> *mut Scalar {
    if value.is_null() {
        crate::set_recent("aclCreateScalar: NULL value (simulated CANN)".into());
        return std::ptr::null_mut();
    }
    use unihal_hal::Scalar as S;
    // SAFETY: `value` points at one value of `data_type` (the caller's contract).
    let v = unsafe {
        match data_type {
            0 => S::F64(*(value as *const f32) as f64),
            1 => S::F64(half::f16::from_bits(*(value as *const u16)).to_f64()),
            27 => S::F64(half::bf16::from_bits(*(value as *const u16)).to_f64()),
            11 => S::F64(*(value as *const f64)),
            2 => S::I64(*(value as *const i8) as i64),
            3 => S::I64(*(value as *const i32) as i64),
            4 => S::I64(*(value as *const u8) as i64),
            6 => S::I64(*(value as *const i16) as i64),
            8 => S::I64(*(value as *const u32) as i64),
            9 => S::I64(*(value as *const i64)),
            10 => S::I64(*(value as *const u64) as i64),
            12 => S::I64((*(value as *const u8) != 0) as i64),
            _ => {
                crate::set_recent(format!(
                    "aclCreateScalar: aclDataType {data_type} is not supported (simulated CANN)"
                ));
                return std::ptr::null_mut();
            }
        }
    };
    register(
        Box::new(Scalar {
            dtype: data_type,
            value: v,
        }),
        Kind::Scalar,
    )
}

/// `aclIntArray`: the values copied at creation.
#[derive(Debug, Clone)]
pub struct IntArray(pub Vec<i64>);
/// `aclFloatArray`.
#[derive(Debug, Clone)]
pub struct FloatArray(pub Vec<f32>);
/// `aclBoolArray`.
#[derive(Debug, Clone)]
pub struct BoolArray(pub Vec<bool>);
/// `aclTensorList`: owns its tensors.
#[derive(Debug, Clone)]
pub struct TensorList(pub Vec<*mut Tensor>);
/// `aclScalarList`: owns its scalars.
#[derive(Debug, Clone)]
pub struct ScalarList(pub Vec<*mut Scalar>);

#[no_mangle]
pub unsafe extern "C" fn aclCreateIntArray(value: *const i64, size: u64) -> *mut IntArray {
    // SAFETY: the caller's array of `size` values.
    match unsafe { array(value, size) } {
        Some(v) => register(Box::new(IntArray(v)), Kind::IntArray),
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn aclCreateFloatArray(value: *const f32, size: u64) -> *mut FloatArray {
    // SAFETY: the caller's array of `size` values.
    match unsafe { array(value, size) } {
        Some(v) => register(Box::new(FloatArray(v)), Kind::FloatArray),
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn aclCreateBoolArray(value: *const bool, size: u64) -> *mut BoolArray {
    // SAFETY: the caller's array of `size` values.
    match unsafe { array(value, size) } {
        Some(v) => register(Box::new(BoolArray(v)), Kind::BoolArray),
        None => std::ptr::null_mut(),
    }
}

/// Takes ownership of `items` (each a live, unowned descriptor of `kind`) for list `list`.
fn adopt(items: &[usize], kind: Kind) -> bool {
    let r = registry().lock();
    let mut seen = std::collections::HashSet::new();
    items.iter().all(|p| {
        seen.insert(*p)
            && r.get(p)
                .is_some_and(|l| l.kind == kind && l.owner.is_none())
    })
}

fn set_owner(items: &[usize], list: usize) {
    let mut r = registry().lock();
    for p in items {
        if let Some(l) = r.get_mut(p) {
            l.owner = Some(list);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn aclCreateTensorList(
    value: *const *const Tensor,
    size: u64,
) -> *mut TensorList {
    // SAFETY: the caller's array of `size` pointers.
    let Some(items) = (unsafe { array(value, size) }) else {
        return std::ptr::null_mut();
    };
    let addrs: Vec<usize> = items.iter().map(|p| *p as usize).collect();
    if !adopt(&addrs, Kind::Tensor) {
        crate::set_recent(
            "aclCreateTensorList: a member is not a live tensor, is repeated, or belongs to another list (simulated CANN)".into(),
        );
        return std::ptr::null_mut();
    }
    let list = register(
        Box::new(TensorList(
            items.iter().map(|p| *p as *mut Tensor).collect(),
        )),
        Kind::TensorList,
    );
    set_owner(&addrs, list as usize);
    list
}

#[no_mangle]
pub unsafe extern "C" fn aclCreateScalarList(
    value: *const *const Scalar,
    size: u64,
) -> *mut ScalarList {
    // SAFETY: the caller's array of `size` pointers.
    let Some(items) = (unsafe { array(value, size) }) else {
        return std::ptr::null_mut();
    };
    let addrs: Vec<usize> = items.iter().map(|p| *p as usize).collect();
    if !adopt(&addrs, Kind::Scalar) {
        return std::ptr::null_mut();
    }
    let list = register(
        Box::new(ScalarList(
            items.iter().map(|p| *p as *mut Scalar).collect(),
        )),
        Kind::ScalarList,
    );
    set_owner(&addrs, list as usize);
    list
}

#[no_mangle]
pub extern "C" fn aclDestroyTensor(p: *const Tensor) -> i32 {
    destroy(p, Kind::Tensor, "aclDestroyTensor")
}

#[no_mangle]
pub extern "C" fn aclDestroyScalar(p: *const Scalar) -> i32 {
    destroy(p, Kind::Scalar, "aclDestroyScalar")
}

#[no_mangle]
pub extern "C" fn aclDestroyIntArray(p: *const IntArray) -> i32 {
    destroy(p, Kind::IntArray, "aclDestroyIntArray")
}

#[no_mangle]
pub extern "C" fn aclDestroyFloatArray(p: *const FloatArray) -> i32 {
    destroy(p, Kind::FloatArray, "aclDestroyFloatArray")
}

#[no_mangle]
pub extern "C" fn aclDestroyBoolArray(p: *const BoolArray) -> i32 {
    destroy(p, Kind::BoolArray, "aclDestroyBoolArray")
}

/// Destroys a list and the members it owns (`M`, each made by `Box::into_raw`), all removed
/// from the registry under one lock before anything is freed: a list destroyed twice, or a
/// member destroyed on its own, is refused, never freed twice.
fn destroy_list<L, M>(p: *const L, kind: Kind, name: &str, members: fn(&L) -> Vec<usize>) -> i32 {
    crate::entry(name, ACLNN_ERR_INNER, || {
        if p.is_null() {
            return Ok(());
        }
        let owned = {
            let mut r = registry().lock();
            match r.get(&(p as usize)).copied() {
                Some(l) if l.kind == kind && l.owner.is_none() => {}
                _ => {
                    let msg = format!("{name}: {p:p} is not a live {kind:?} (double destroy?)");
                    unihal_sim::fault::violation(msg.clone());
                    return Err(Err::new(ACLNN_ERR_PARAM_INVALID, msg));
                }
            }
            r.remove(&(p as usize));
            // SAFETY: registered as a live `L` (made by Box::into_raw) and removed just now
            // under the lock, so nothing else frees it; read once, then freed below.
            let list = unsafe { Box::from_raw(p as *mut L) };
            let owned = members(&list);
            for m in &owned {
                r.remove(m);
            }
            owned
        };
        for m in owned {
            // SAFETY: each member was made by Box::into_raw of an `M`, owned by this list (its
            // own destroy is refused) and removed from the registry above with the list.
            drop(unsafe { Box::from_raw(m as *mut M) });
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclDestroyTensorList(p: *const TensorList) -> i32 {
    destroy_list::<TensorList, Tensor>(p, Kind::TensorList, "aclDestroyTensorList", |l| {
        l.0.iter().map(|t| *t as usize).collect()
    })
}

#[no_mangle]
pub extern "C" fn aclDestroyScalarList(p: *const ScalarList) -> i32 {
    destroy_list::<ScalarList, Scalar>(p, Kind::ScalarList, "aclDestroyScalarList", |l| {
        l.0.iter().map(|s| *s as usize).collect()
    })
}

/// `aclnnStatus aclnnInit(const char *configPath)`: nothing to configure here.
#[no_mangle]
pub extern "C" fn aclnnInit(_config_path: *const std::ffi::c_char) -> i32 {
    crate::entry("aclnnInit", ACLNN_ERR_INNER, || {
        crate::runtime::sim()
            .map(|_| ())
            .map_err(|e| Err::new(ACLNN_ERR_RUNTIME_ERROR, e.msg))
    })
}

/// `aclnnStatus aclnnFinalize(void)`.
#[no_mangle]
pub extern "C" fn aclnnFinalize() -> i32 {
    0
}
