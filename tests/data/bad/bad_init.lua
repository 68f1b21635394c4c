-- param() with a number where an initializer belongs
local w = param("w", {4, 4}, 0.02) -- ERROR
minimize(w:sum())
