//! `{"n": N}` → `{"count": <primes below N>}`, through the SDK.
peerwasm_sdk::main!(peerwasm_guest_examples::primes);
