//! The C ABI class of a binding's types, to check a hand-written declaration against bindgen's
//! reading of the vendor's real header (the backends' and simulators' `abi` tests): each
//! parameter and result is an integer, a float or a pointer of some size; two declarations
//! agree when every class agrees. Enum-typed parameters are integers of their size, callbacks and
//! nullable callbacks pointers.
//!
//! Only types are compared: nothing here calls or loads anything.

/// The ABI class of a C type: `("int" | "float" | "ptr", size in bytes)`.
pub trait Abi {
    const KIND: (&'static str, usize);
}

macro_rules! abi {
    ($($t:ty => $k:literal),* $(,)?) => {
        $(impl Abi for $t {
            const KIND: (&'static str, usize) = ($k, std::mem::size_of::<$t>());
        })*
    };
}
abi!(i8 => "int", u8 => "int", i16 => "int", u16 => "int", i32 => "int", u32 => "int",
     i64 => "int", u64 => "int", usize => "int", isize => "int", f32 => "float", f64 => "float",
     bool => "int");

impl Abi for () {
    // A `void` result.
    const KIND: (&'static str, usize) = ("void", 0);
}
impl<T> Abi for *mut T {
    const KIND: (&'static str, usize) = ("ptr", std::mem::size_of::<usize>());
}
impl<T> Abi for *const T {
    const KIND: (&'static str, usize) = ("ptr", std::mem::size_of::<usize>());
}
impl<T> Abi for Option<T> {
    // A nullable function pointer.
    const KIND: (&'static str, usize) = ("ptr", std::mem::size_of::<usize>());
}

/// The ABI of a function pointer type: its parameters' classes, then its result's.
pub trait Sig {
    fn kinds() -> Vec<(&'static str, usize)>;
}

macro_rules! sig {
    ($($a:ident),*) => {
        impl<R: Abi, $($a: Abi),*> Sig for unsafe extern "C" fn($($a),*) -> R {
            fn kinds() -> Vec<(&'static str, usize)> {
                vec![$($a::KIND,)* R::KIND]
            }
        }
        // A callback parameter is a pointer, whatever its own signature.
        impl<R, $($a),*> Abi for unsafe extern "C" fn($($a),*) -> R {
            const KIND: (&'static str, usize) = ("ptr", std::mem::size_of::<usize>());
        }
    };
}
sig!();
sig!(A);
sig!(A, B);
sig!(A, B, C);
sig!(A, B, C, D);
sig!(A, B, C, D, E);
sig!(A, B, C, D, E, F);
sig!(A, B, C, D, E, F, G);
sig!(A, B, C, D, E, F, G, H);
sig!(A, B, C, D, E, F, G, H, I);
sig!(A, B, C, D, E, F, G, H, I, J);
sig!(A, B, C, D, E, F, G, H, I, J, K);
sig!(A, B, C, D, E, F, G, H, I, J, K, L);
sig!(A, B, C, D, E, F, G, H, I, J, K, L, M);
sig!(A, B, C, D, E, F, G, H, I, J, K, L, M, N);

/// The ABI of a binding's entry (a function pointer).
pub fn ours<F: Sig>(_: &F) -> Vec<(&'static str, usize)> {
    F::kinds()
}

/// The ABI of an optional entry.
pub fn ours_opt<F: Sig>(_: &Option<F>) -> Vec<(&'static str, usize)> {
    F::kinds()
}

/// The ABI of a header's declaration as bindgen's dynamic-library mode types it (whether or not
/// the library exports it).
pub fn declared<F: Sig, E>(_: &Result<F, E>) -> Vec<(&'static str, usize)> {
    F::kinds()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_a_few_signatures() {
        let f: unsafe extern "C" fn(*mut u8, u64, i32) -> i32 = {
            unsafe extern "C" fn g(_: *mut u8, _: u64, _: i32) -> i32 {
                0
            }
            g
        };
        assert_eq!(
            ours(&f),
            vec![("ptr", 8), ("int", 8), ("int", 4), ("int", 4)]
        );
        let r: Result<unsafe extern "C" fn(f32), ()> = Err(());
        assert_eq!(declared(&r), vec![("float", 4), ("void", 0)]);
    }
}
