//! The C library's own dynamic-linker functions (`dlsym`, `dlvsym`,
//! `dlopen`, `dlmopen`), found without asking the dynamic linker: the shim
//! exports its own versions of all four, so any lookup it made by name
//! (`dlsym`, `dlvsym`, even with `RTLD_NEXT` from a function that is ours)
//! would come back to itself. This reads the symbol table of the loaded
//! object that defines them (libc.so.6 since glibc 2.34, libdl.so.2 before)
//! through `dl_iterate_phdr`, the way the dynamic linker itself does (GNU
//! hash, else SysV hash).

use std::ffi::{c_char, c_int, c_void, CStr};

/// An entry of a dynamic section (`Elf64_Dyn`).
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;

/// What the search looks for, and what it found.
struct Search<'a> {
    name: &'a CStr,
    found: *mut c_void,
}

/// The address of `name` as defined by the C library (`libc.so*`, else
/// `libdl.so*`) loaded in this process; null when none defines it.
pub fn libc_function(name: &CStr) -> *mut c_void {
    let mut s = Search {
        name,
        found: std::ptr::null_mut(),
    };
    // SAFETY: dl_iterate_phdr calls `visit` with valid dl_phdr_info
    // records under the loader's lock; `s` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut s as *mut Search).cast()) };
    s.found
}

/// The libraries that may define the C library's loader functions.
fn is_libc(path: &[u8]) -> bool {
    let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    file.starts_with(b"libc.so") || file.starts_with(b"libdl.so")
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the Search passed to dl_iterate_phdr; `info` is valid
    // for this call (the loader's contract).
    let (s, info) = unsafe { (&mut *(data as *mut Search), &*info) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: the loader's NUL-terminated name of the object.
    let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    if !is_libc(path) {
        return 0;
    }
    // SAFETY: the object is mapped while the loader's lock is held; its
    // program headers and dynamic section are the loader's own.
    let p = unsafe { lookup(info, s.name) };
    if p.is_null() {
        return 0;
    }
    s.found = p;
    1
}

/// `name`'s definition in the object `info` describes.
///
/// # Safety
/// `info` describes a loaded object (dl_iterate_phdr's callback).
unsafe fn lookup(info: &libc::dl_phdr_info, name: &CStr) -> *mut c_void {
    let base = info.dlpi_addr as usize;
    let mut dynamic: *const Dyn = std::ptr::null();
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr holds dlpi_phnum headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_DYNAMIC {
            dynamic = (base + ph.p_vaddr as usize) as *const Dyn;
        }
    }
    if dynamic.is_null() {
        return std::ptr::null_mut();
    }
    let (mut symtab, mut strtab, mut gnu_hash, mut hash) = (0usize, 0usize, 0usize, 0usize);
    let mut d = dynamic;
    loop {
        // SAFETY: the dynamic section is an array ended by DT_NULL.
        let e = unsafe { &*d };
        if e.tag == DT_NULL {
            break;
        }
        // glibc relocates these in place where the section is writable,
        // not where it is read-only: an address below the base is relative.
        let v = e.val as usize;
        let v = if v < base { base + v } else { v };
        match e.tag {
            DT_SYMTAB => symtab = v,
            DT_STRTAB => strtab = v,
            DT_HASH => hash = v,
            DT_GNU_HASH => gnu_hash = v,
            _ => {}
        }
        // SAFETY: still within the DT_NULL-terminated array.
        d = unsafe { d.add(1) };
    }
    if symtab == 0 || strtab == 0 {
        return std::ptr::null_mut();
    }
    let syms = symtab as *const libc::Elf64_Sym;
    let want = name.to_bytes();
    let matches = |i: usize| -> Option<*mut c_void> {
        // SAFETY: `i` comes from the object's own hash table.
        let sym = unsafe { &*syms.add(i) };
        let kind = sym.st_info & 0xf;
        // Undefined, or not a plain function (STT_FUNC: the loader's
        // functions are no IFUNCs, whose resolver would have to be called).
        if sym.st_shndx == 0 || sym.st_value == 0 || kind != 2 {
            return None;
        }
        // SAFETY: st_name indexes the object's string table.
        let n = unsafe { CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char) };
        (n.to_bytes() == want).then(|| (base + sym.st_value as usize) as *mut c_void)
    };
    if gnu_hash != 0 {
        // SAFETY: the GNU hash table's documented layout, in the object's memory.
        return unsafe { gnu_lookup(gnu_hash as *const u32, want, matches) }
            .unwrap_or(std::ptr::null_mut());
    }
    if hash != 0 {
        let h = hash as *const u32;
        // SAFETY: the SysV hash table: nbucket, nchain, buckets, chains.
        unsafe {
            let nbucket = *h as usize;
            let buckets = h.add(2);
            let chains = buckets.add(nbucket);
            let mut i = *buckets.add(sysv_hash(want) as usize % nbucket) as usize;
            while i != 0 {
                if let Some(p) = matches(i) {
                    return p;
                }
                i = *chains.add(i) as usize;
            }
        }
    }
    std::ptr::null_mut()
}

/// # Safety
/// `t` is a GNU hash table of a loaded object.
unsafe fn gnu_lookup(
    t: *const u32,
    name: &[u8],
    matches: impl Fn(usize) -> Option<*mut c_void>,
) -> Option<*mut c_void> {
    // SAFETY: header: nbuckets, symoffset, bloom size (in words), shift;
    // then the bloom words (64-bit), the buckets, the chains.
    unsafe {
        let (nbuckets, symoffset, bloom_size) = (*t as usize, *t.add(1) as usize, *t.add(2));
        if nbuckets == 0 {
            return None;
        }
        let buckets = t.add(4 + 2 * bloom_size as usize);
        let chains = buckets.add(nbuckets);
        let h = gnu_hash(name);
        let mut i = *buckets.add(h as usize % nbuckets) as usize;
        if i < symoffset {
            return None;
        }
        loop {
            let h2 = *chains.add(i - symoffset);
            if h | 1 == h2 | 1 {
                if let Some(p) = matches(i) {
                    return Some(p);
                }
            }
            if h2 & 1 != 0 {
                return None;
            }
            i += 1;
        }
    }
}

fn gnu_hash(name: &[u8]) -> u32 {
    name.iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32))
}

fn sysv_hash(name: &[u8]) -> u32 {
    let mut h = 0u32;
    for &c in name {
        h = (h << 4).wrapping_add(c as u32);
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_c_library_s_own_loader_functions() {
        for name in [c"dlsym", c"dlvsym", c"dlopen", c"dlmopen"] {
            let p = libc_function(name);
            assert!(!p.is_null(), "{name:?}");
            let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
            // SAFETY: dladdr fills `info`.
            assert_ne!(unsafe { libc::dladdr(p, info.as_mut_ptr()) }, 0);
            // SAFETY: filled by the successful dladdr.
            let info = unsafe { info.assume_init() };
            // SAFETY: the loader's NUL-terminated names.
            let (file, sym) = unsafe {
                (
                    CStr::from_ptr(info.dli_fname).to_bytes(),
                    CStr::from_ptr(info.dli_sname),
                )
            };
            assert!(
                is_libc(file),
                "{name:?} in {:?}",
                String::from_utf8_lossy(file)
            );
            assert_eq!(sym, name);
        }
        assert!(libc_function(c"no_such_function_here").is_null());
    }
}
