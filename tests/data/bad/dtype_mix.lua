-- adding an i32 tensor to an f32 tensor
local x = input("x", {4, 8})
local i = input("i", {4, 8}, "i32")
local z = x * i -- ERROR
minimize(z:sum())
