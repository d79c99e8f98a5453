//! AMDGPU code objects as `hipModuleLoadData` takes them: a raw AMDGPU ELF, or a clang offload
//! bundle (uncompressed) holding one per architecture, read as AMD documents them (LLVM's
//! "AMDGPU Backend User Guide": code object v3+ metadata, `EF_AMDGPU_MACH`; clang's offload
//! bundle format). The HIP backend reads each kernel's explicit argument sizes from the
//! `amdhsa.kernels` list of the ELF's AMDGPU metadata note (msgpack), hidden arguments
//! (`hidden_*` value kinds, which the runtime fills) skipped, so launches are size-checked; the
//! simulated HIP runtime also reads the architecture and the kernel descriptors, as the real
//! loader does.

use object::elf;
use object::read::elf::{FileHeader, SectionHeader};
use rmpv::Value;
use std::collections::HashMap;
use unihal_hal::{HalError, Invalid, Result};

/// `NT_AMDGPU_METADATA`: the note type of the msgpack metadata (owner "AMDGPU").
const NT_AMDGPU_METADATA: u32 = 32;
/// The magic of an uncompressed clang offload bundle.
const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
/// The magic of a compressed one.
const COMPRESSED_MAGIC: &[u8] = b"CCOB";

fn bad(why: impl Into<String>) -> HalError {
    HalError::invalid(
        "source",
        Invalid::Value {
            value: why.into(),
            accepted: "an AMDGPU ELF code object or an uncompressed clang offload bundle of them"
                .into(),
        },
    )
}

/// `EF_AMDGPU_MACH` values of the architectures unihal names (LLVM's AMDGPU user guide).
const MACHS: [(u32, &str); 12] = [
    (0x02c, "gfx900"),
    (0x02f, "gfx906"),
    (0x030, "gfx908"),
    (0x032, "gfx90c"),
    (0x033, "gfx1010"),
    (0x036, "gfx1030"),
    (0x037, "gfx1031"),
    (0x03f, "gfx90a"),
    (0x040, "gfx940"),
    (0x041, "gfx1100"),
    (0x04b, "gfx941"),
    (0x04c, "gfx942"),
];

/// The mask of the architecture in an AMDGPU ELF's `e_flags`.
const EF_AMDGPU_MACH: u32 = 0x0ff;

/// The architecture an AMDGPU ELF was built for (`None` for a machine value not in the table).
///
/// # Errors
/// As [`kernel_args`] for data that is not an AMDGPU ELF.
pub fn elf_arch(elf_data: &[u8]) -> Result<Option<&'static str>> {
    let (header, endian) = amdgpu_header(elf_data)?;
    let mach = header.e_flags(endian) & EF_AMDGPU_MACH;
    Ok(MACHS.iter().find(|(m, _)| *m == mach).map(|(_, n)| *n))
}

/// The kernels an AMDGPU ELF defines: the symbols `K` with a kernel descriptor `K.kd`.
///
/// # Errors
/// As [`kernel_args`].
pub fn kernel_symbols(elf_data: &[u8]) -> Result<Vec<String>> {
    let (header, endian) = amdgpu_header(elf_data)?;
    let sections = header
        .sections(endian, elf_data)
        .map_err(|e| bad(format!("unreadable ELF sections: {e}")))?;
    let mut names = Vec::new();
    for table in [elf::SHT_SYMTAB, elf::SHT_DYNSYM] {
        let symbols = sections
            .symbols(endian, elf_data, table)
            .map_err(|e| bad(format!("an unreadable ELF symbol table: {e}")))?;
        for sym in symbols.iter() {
            let name = symbols
                .symbol_name(endian, sym)
                .map_err(|e| bad(format!("an unreadable ELF symbol name: {e}")))?;
            if let Some(k) = name.strip_suffix(b".kd") {
                let k = String::from_utf8_lossy(k).into_owned();
                if !names.contains(&k) {
                    names.push(k);
                }
            }
        }
    }
    Ok(names)
}

/// The byte length of the image at the start of `prefix` as far as its headers say (an ELF: its
/// section and program header tables end it; a bundle: its last entry), or `None` when `prefix`
/// is too short to tell; `need` is then how many bytes to read.
///
/// # Errors
/// [`HalError::InvalidArgument`] for data that is neither.
pub fn image_len(prefix: &[u8]) -> Result<std::result::Result<usize, usize>> {
    if prefix.starts_with(b"\x7fELF") {
        if prefix.len() < 64 {
            return Ok(Err(64));
        }
        let (header, endian) = amdgpu_header(prefix)?;
        let sh = header.e_shoff(endian) as usize
            + header.e_shnum(endian) as usize * header.e_shentsize(endian) as usize;
        let ph = header.e_phoff(endian) as usize
            + header.e_phnum(endian) as usize * header.e_phentsize(endian) as usize;
        return Ok(Ok(sh.max(ph).max(64)));
    }
    if prefix.starts_with(BUNDLE_MAGIC) {
        let header = BUNDLE_MAGIC.len() + 8;
        if prefix.len() < header {
            return Ok(Err(header));
        }
        let count = u64::from_le_bytes(prefix[BUNDLE_MAGIC.len()..header].try_into().expect("8"));
        if count > 4096 {
            return Err(bad(format!("an offload bundle claiming {count} entries")));
        }
        let (mut at, mut end) = (header, header);
        for _ in 0..count {
            if prefix.len() < at + 24 {
                return Ok(Err(at + 24));
            }
            let word = |i: usize| {
                u64::from_le_bytes(prefix[at + 8 * i..at + 8 * i + 8].try_into().expect("8"))
            };
            let (offset, size, triple) = (word(0), word(1), word(2));
            at += 24 + triple as usize;
            end = end.max(offset.saturating_add(size) as usize).max(at);
        }
        return Ok(Ok(end));
    }
    // Too short to tell yet: the start of a bundle's magic asks for its whole header.
    if prefix.len() < BUNDLE_MAGIC.len() && BUNDLE_MAGIC.starts_with(prefix) {
        return Ok(Err(BUNDLE_MAGIC.len() + 8));
    }
    Err(bad("neither an ELF nor an offload bundle"))
}

/// The AMDGPU ELF for `arch` in `data` (a raw ELF is taken as it is; a bundle's entry is chosen
/// by the architecture at the end of its target triple, features after `:` ignored).
///
/// # Errors
/// [`HalError::InvalidArgument`] for a malformed bundle; `Ok(None)` when the bundle has no entry
/// for `arch`.
pub fn code_object_for<'a>(data: &'a [u8], arch: &str) -> Result<Option<&'a [u8]>> {
    if !data.starts_with(BUNDLE_MAGIC) {
        return Ok(Some(data));
    }
    Ok(bundle_entries(data)?
        .into_iter()
        .find_map(|(triple, body)| {
            let target = triple.rsplit('-').next().unwrap_or("");
            (triple.contains("amdgcn") && target.split(':').next() == Some(arch)).then_some(body)
        }))
}

fn amdgpu_header(
    elf_data: &[u8],
) -> Result<(
    &elf::FileHeader64<object::LittleEndian>,
    object::LittleEndian,
)> {
    let header = elf::FileHeader64::<object::LittleEndian>::parse(elf_data)
        .map_err(|e| bad(format!("not a 64-bit ELF: {e}")))?;
    let endian = header
        .endian()
        .map_err(|e| bad(format!("an ELF of unknown byte order: {e}")))?;
    if header.e_machine(endian) != elf::EM_AMDGPU {
        return Err(bad(format!(
            "an ELF for machine {} (AMDGPU is {})",
            header.e_machine(endian),
            elf::EM_AMDGPU
        )));
    }
    Ok((header, endian))
}

/// The code objects of an offload bundle, with their target triples.
///
/// # Errors
/// [`HalError::InvalidArgument`] for a truncated or malformed bundle.
pub fn bundle_entries(data: &[u8]) -> Result<Vec<(String, &[u8])>> {
    let u64_at = |at: usize| -> Result<u64> {
        data.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| bad("a truncated offload bundle"))
    };
    let count = u64_at(BUNDLE_MAGIC.len())?;
    if count > 4096 {
        return Err(bad(format!("an offload bundle claiming {count} entries")));
    }
    let mut at = BUNDLE_MAGIC.len() + 8;
    let mut out = Vec::new();
    for _ in 0..count {
        let (offset, size, triple_len) = (u64_at(at)?, u64_at(at + 8)?, u64_at(at + 16)?);
        at += 24;
        let triple = data
            .get(at..at.saturating_add(triple_len as usize))
            .ok_or_else(|| bad("a truncated offload bundle entry"))?;
        at += triple_len as usize;
        let body = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(size).ok())
            .and_then(|(o, s)| data.get(o..o.checked_add(s)?))
            .ok_or_else(|| bad("an offload bundle entry outside the bundle"))?;
        out.push((String::from_utf8_lossy(triple).into_owned(), body));
    }
    Ok(out)
}

/// Explicit argument sizes per kernel, from an AMDGPU ELF's metadata note (empty when the code
/// object has none: its launches are then not size-checked).
///
/// # Errors
/// [`HalError::InvalidArgument`] for data that is not a 64-bit little-endian AMDGPU ELF, or
/// metadata that cannot be read.
pub fn kernel_args(elf_data: &[u8]) -> Result<HashMap<String, Vec<usize>>> {
    let (header, endian) = amdgpu_header(elf_data)?;
    let sections = header
        .sections(endian, elf_data)
        .map_err(|e| bad(format!("unreadable ELF sections: {e}")))?;
    for section in sections.iter() {
        let Some(mut notes) = section
            .notes(endian, elf_data)
            .map_err(|e| bad(format!("an unreadable ELF note section: {e}")))?
        else {
            continue;
        };
        while let Some(note) = notes
            .next()
            .map_err(|e| bad(format!("an unreadable ELF note: {e}")))?
        {
            if note.name() == b"AMDGPU" && note.n_type(endian) == NT_AMDGPU_METADATA {
                return parse_metadata(note.desc());
            }
        }
    }
    Ok(HashMap::new())
}

fn field<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// Reads `amdhsa.kernels` from the msgpack metadata.
fn parse_metadata(mut desc: &[u8]) -> Result<HashMap<String, Vec<usize>>> {
    let root = rmpv::decode::read_value(&mut desc)
        .map_err(|e| bad(format!("unreadable AMDGPU metadata: {e}")))?;
    let kernels = field(&root, "amdhsa.kernels")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("AMDGPU metadata without amdhsa.kernels"))?;
    let mut out = HashMap::new();
    for k in kernels {
        let name = field(k, ".name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("a kernel without .name in the AMDGPU metadata"))?;
        let mut sizes = Vec::new();
        for arg in field(k, ".args")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let kind = field(arg, ".value_kind")
                .and_then(Value::as_str)
                .unwrap_or("");
            if kind.starts_with("hidden_") {
                continue;
            }
            let size = field(arg, ".size")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(format!("an argument of {name} without .size")))?;
            sizes.push(size as usize);
        }
        out.insert(name.to_string(), sizes);
    }
    Ok(out)
}

/// The explicit argument sizes of each kernel of a HIP code object as `hipModuleLoadData` takes
/// it (a raw AMDGPU ELF, or an uncompressed bundle: those of its first AMDGPU entry).
///
/// # Errors
/// [`HalError::InvalidArgument`] for compressed bundles, bundles without an AMDGPU entry and
/// anything that is not an AMDGPU ELF.
pub fn prepare(bytes: &[u8]) -> Result<HashMap<String, Vec<usize>>> {
    let params = if bytes.starts_with(BUNDLE_MAGIC) {
        let entries = bundle_entries(bytes)?;
        let (_, elf) = entries
            .iter()
            .find(|(triple, _)| triple.contains("amdgcn"))
            .ok_or_else(|| bad("an offload bundle without an amdgcn code object"))?;
        kernel_args(elf)?
    } else if bytes.starts_with(COMPRESSED_MAGIC) {
        return Err(HalError::unsupported(
            "compressed offload bundles (CCOB): pass an uncompressed bundle or a raw code object",
        ));
    } else {
        kernel_args(bytes)?
    };
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_invalid_argument_naming_the_source() {
        for data in [
            &b""[..],
            b"\x7fELF",
            b"not an elf at all",
            b"__CLANG_OFFLOAD_BUNDLE__\x05",
        ] {
            match prepare(data) {
                Err(HalError::InvalidArgument { arg, .. }) => assert_eq!(arg, "source"),
                other => panic!("{data:?}: {other:?}"),
            }
        }
        assert!(matches!(
            prepare(b"CCOB\x01\x00"),
            Err(HalError::Unsupported { .. })
        ));
    }

    #[test]
    fn metadata_lists_explicit_arguments_only() {
        let mut buf = Vec::new();
        let arg = |size: u64, kind: &str| {
            Value::Map(vec![
                (Value::from(".size"), Value::from(size)),
                (Value::from(".value_kind"), Value::from(kind)),
            ])
        };
        let root = Value::Map(vec![(
            Value::from("amdhsa.kernels"),
            Value::Array(vec![Value::Map(vec![
                (Value::from(".name"), Value::from("k")),
                (
                    Value::from(".args"),
                    Value::Array(vec![
                        arg(8, "global_buffer"),
                        arg(4, "by_value"),
                        arg(8, "hidden_global_offset_x"),
                    ]),
                ),
            ])]),
        )]);
        rmpv::encode::write_value(&mut buf, &root).unwrap();
        let m = parse_metadata(&buf).unwrap();
        assert_eq!(m["k"], vec![8, 4]);
    }

    #[test]
    fn image_len_reads_a_bundle_from_its_first_bytes() {
        let mut b = BUNDLE_MAGIC.to_vec();
        b.extend(1u64.to_le_bytes());
        let triple = b"hipv4-amdgcn-amd-amdhsa--gfx90a";
        let offset = (b.len() + 24 + triple.len()) as u64;
        b.extend(offset.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend((triple.len() as u64).to_le_bytes());
        b.extend(triple);
        b.extend(b"abc");
        // A reader that grows its prefix as asked, from 4 bytes (as the simulated runtime does).
        let mut need = 4;
        let len = loop {
            match image_len(&b[..need.min(b.len())]).unwrap() {
                Ok(len) => break len,
                Err(more) => {
                    assert!(more > need, "no progress at {need}");
                    need = more;
                }
            }
        };
        assert_eq!(len, b.len());
        assert!(image_len(b"MZ\x90\x00").is_err());
    }

    #[test]
    fn bundles_are_read_entry_by_entry() {
        let mut b = BUNDLE_MAGIC.to_vec();
        b.extend(1u64.to_le_bytes());
        let triple = b"hipv4-amdgcn-amd-amdhsa--gfx90a";
        let offset = (b.len() + 24 + triple.len()) as u64;
        b.extend(offset.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend((triple.len() as u64).to_le_bytes());
        b.extend(triple);
        b.extend(b"abc");
        let e = bundle_entries(&b).unwrap();
        assert_eq!(
            e,
            vec![(String::from_utf8_lossy(triple).into_owned(), &b"abc"[..])]
        );
        // An entry pointing past the end.
        let n = b.len();
        b.truncate(n - 1);
        assert!(bundle_entries(&b).is_err());
    }
}
