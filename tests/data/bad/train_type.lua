-- train{} with a string where a number belongs
local x = input("x", {4, 8})
minimize(x:sum())
train{lr = "fast"} -- ERROR
