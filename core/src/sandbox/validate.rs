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
    Err("not a WebAssembly module (it does not start with \\0asm)".into())
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
    }
}
