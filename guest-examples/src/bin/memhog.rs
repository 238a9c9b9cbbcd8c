//! Reads N from stdin, allocates and touches N MiB, prints N.
fn main() {
    let n = peerwasm_guest_examples::stdin_number();
    std::hint::black_box(peerwasm_guest_examples::hog(n));
    println!("{n}");
}
