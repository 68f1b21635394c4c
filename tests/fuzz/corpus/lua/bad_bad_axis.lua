-- reduction over an axis the tensor does not have
local x = input("x", {4, 8})
local s = x:sum(2) -- ERROR
minimize(s:sum())
