-- select() with a float tensor where a u8 mask belongs
local x = input("x", {4, 8})
local y = select(x, x, 0) -- ERROR
minimize(y:sum())
