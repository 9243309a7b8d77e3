fn main() {
    println!("{}", stile::component::COMPONENT.len());
}
