-- a param whose element count overflows int64 is an error at its line
local w = param("w", {65536, 65536, 65536, 65536}, zeros()) -- ERROR
minimize(w:sum())
