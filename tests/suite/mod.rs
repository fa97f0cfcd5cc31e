mod common;

mod basic;
mod cleanup;
mod fs;
mod isolation;
mod limits;
