//! Reads milliseconds from stdin and burns that much CPU.
fn main() {
    let ms = peerwasm_guest_examples::stdin_number();
    std::hint::black_box(peerwasm_guest_examples::spin(ms));
    println!("spun {ms} ms");
}
