//! The Tessera node driver: prepare/unprepare, checkpoint, sharing, MIG, health, slice publisher.
