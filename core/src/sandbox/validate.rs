//! Cheap checks on module bytes before wasmtime compiles them, so the common
//! mistakes get a message that says what to do rather than a parser error.
//! Core modules (wasm32-wasip1) and components (wasm32-wasip2) both pass.

/// The 8-byte preamble of a core wasm module: magic and version 1.
const CORE_PREAMBLE: [u8; 8] = *b"\0asm\x01\0\0\0";
/// The preamble of a component (component-model layer 1).
const COMPONENT_PREAMBLE: [u8; 8] = *b"\0asm\x0d\0\x01\0";

/// `Ok` if `bytes` start like a core wasm module or a component; otherwise
/// why not.
pub fn check_header(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() >= 8 && (bytes[..8] == CORE_PREAMBLE || bytes[..8] == COMPONENT_PREAMBLE) {
        return Ok(());
    }
    if bytes.len() >= 4 && &bytes[..4] == b"\0asm" {
        return Err("unsupported WebAssembly binary version".into());
    }
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]);
    if text.trim_start().starts_with("(module") {
        return Err(
            "this is WebAssembly text (WAT), not a binary module; convert it with wat2wasm".into(),
        );
    }
    if bytes.is_empty() {
        return Err("the file is empty".into());
    }
    if bytes.starts_with(b"\x7fELF") || bytes.starts_with(b"MZ") || is_mach_o(bytes) {
        return Err(
            "this is a native executable, not WebAssembly; build it for the sandbox with \
             `cargo build --target wasm32-wasip1` (or your compiler's wasm32-wasi target)"
                .into(),
        );
    }
    if looks_like_python(&text) {
        return Err(
            "this looks like a Python script, not WebAssembly; run it with \
             `peerwasm run --python SCRIPT.py`"
                .into(),
        );
    }
    Err("not a WebAssembly module (it does not start with \\0asm)".into())
}

/// A Mach-O binary's magic, either byte order, 32 or 64 bits.
fn is_mach_o(bytes: &[u8]) -> bool {
    bytes.len() >= 4
        && matches!(
            u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            0xfeed_face | 0xfeed_facf | 0xcefa_edfe | 0xcffa_edfe
        )
}

/// Whether the start of a text file reads like a Python script: a
/// `python` shebang, or a first line that imports.
fn looks_like_python(start: &str) -> bool {
    let first = start.trim_start().lines().next().unwrap_or("");
    (first.starts_with("#!") && first.contains("python"))
        || first.starts_with("import ")
        || first.starts_with("from ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_the_kinds_apart() {
        assert!(check_header(b"\0asm\x01\0\0\0rest").is_ok());
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok(), "a component");
        assert!(
            check_header(b"\0asm\x0e\0\x01\0")
                .unwrap_err()
                .contains("version")
        );
        assert!(check_header(b"(module)").unwrap_err().contains("WAT"));
        assert!(
            check_header(b"hello world")
                .unwrap_err()
                .contains("not a WebAssembly module")
        );
        assert!(
            check_header(b"\0as")
                .unwrap_err()
                .contains("not a WebAssembly module")
        );
        assert!(check_header(b"").unwrap_err().contains("empty"));
        for native in [
            &b"\x7fELF\x02\x01\x01"[..],
            b"MZ\x90\0",
            b"\xcf\xfa\xed\xfe\x07",
        ] {
            assert!(check_header(native).unwrap_err().contains("wasm32-wasip1"));
        }
        for script in [
            &b"#!/usr/bin/env python3\nprint(1)"[..],
            b"import numpy as np\n",
            b"\nfrom x import y",
        ] {
            assert!(check_header(script).unwrap_err().contains("--python"));
        }
        assert!(
            check_header(b"print('hello')")
                .unwrap_err()
                .contains("not a WebAssembly module")
        );
    }
}
