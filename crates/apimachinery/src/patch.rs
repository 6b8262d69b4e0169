//! JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch.
