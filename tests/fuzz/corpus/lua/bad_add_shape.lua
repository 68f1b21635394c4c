-- adding tensors whose shapes do not broadcast
local x = input("x", {4, 8})
local y = input("y", {4, 9})
local z = x + y -- ERROR
minimize(z:sum())
