//! Element types of device data.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of device data. f16 and bf16 are the `half` crate's [`half::f16`] and [`half::bf16`].
///
/// The numeric discriminants are unihal's own and stable (they will appear in the C plugin ABI); they
/// are not any vendor's enum values, which the backends convert in their `conv` modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum DType {
    F64 = 0,
    F32 = 1,
    F16 = 2,
    Bf16 = 3,
    I8 = 4,
    U8 = 5,
    I16 = 6,
    I32 = 7,
    I64 = 8,
    U32 = 9,
    U64 = 10,
    Bool = 11,
}

impl DType {
    /// Every dtype, in discriminant order.
    pub const ALL: [DType; 12] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// Size of one element in bytes (bool is one byte, 0 or 1).
    #[inline]
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::Bf16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// True for f64, f32, f16 and bf16.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::Bf16)
    }

    /// True for the signed and unsigned integer types (not bool).
    pub const fn is_integer(self) -> bool {
        !self.is_float() && !matches!(self, DType::Bool)
    }

    /// The lower-case name used in case ids, reports and the CLI (`f32`, `bf16`, `bool`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
        }
    }

    /// Parses a name produced by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Rust element types that have a [`DType`]. Implemented for the primitive types, `bool`,
/// [`half::f16`] and [`half::bf16`].
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f64 => F64, f32 => F32, half::f16 => F16, half::bf16 => Bf16, i8 => I8, u8 => U8,
    i16 => I16, i32 => I32, i64 => I64, u32 => U32, u64 => U64, bool => Bool);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_rust() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::Bf16.size(), std::mem::size_of::<half::bf16>());
        assert_eq!(<half::f16 as Element>::DTYPE, DType::F16);
        assert_eq!(serde_json::to_string(&DType::Bf16).unwrap(), "\"bf16\"");
    }
}
