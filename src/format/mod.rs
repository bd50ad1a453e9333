//! The formats the stages read and write.

pub mod formenc;
pub mod registry;
pub mod rubyfloat;
pub mod storefile;
pub mod text;
