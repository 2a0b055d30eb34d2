from jinja2.runtime import LoopContext, Macro, Markup, Namespace, TemplateNotFound, TemplateReference, TemplateRuntimeError, Undefined, escape, identity, internalcode, markup_join, missing, str_join
name = 'parts.j2'

def root(context, missing=missing):
    resolve = context.resolve_or_missing
    undefined = environment.undefined
    concat = environment.concat
    cond_expr_undefined = Undefined
    if 0: yield None
    l_0_metadata = l_0_env = missing
    try:
        t_1 = environment.filters['tojson']
    except KeyError:
        @internalcode
        def t_1(*unused):
            raise TemplateRuntimeError("No filter named 'tojson' found.")
    try:
        t_2 = environment.tests['none']
    except KeyError:
        @internalcode
        def t_2(*unused):
            raise TemplateRuntimeError("No test named 'none' found.")
    pass
    def macro(l_1_meta):
        t_3 = []
        if l_1_meta is missing:
            l_1_meta = undefined("parameter 'meta' was not provided", name='meta')
        pass
        t_3.extend((
            'name: ',
            str(t_1(environment.getattr(l_1_meta, 'name'))),
            '\n',
        ))
        if environment.getattr(l_1_meta, 'namespace'):
            pass
            t_3.extend((
                'namespace: ',
                str(t_1(environment.getattr(l_1_meta, 'namespace'))),
                '\n',
            ))
        t_3.extend((
            'labels: ',
            str(t_1(environment.getattr(l_1_meta, 'labels'))),
            '\n',
        ))
        if environment.getattr(l_1_meta, 'annotations'):
            pass
            t_3.extend((
                'annotations: ',
                str(t_1(environment.getattr(l_1_meta, 'annotations'))),
                '\n',
            ))
        return concat(t_3)
    context.exported_vars.add('metadata')
    context.vars['metadata'] = l_0_metadata = Macro(environment, macro, 'metadata', ('meta',), False, False, False, context.eval_ctx.autoescape)
    yield '\n'
    def macro(l_1_variables):
        t_4 = []
        if l_1_variables is missing:
            l_1_variables = undefined("parameter 'variables' was not provided", name='variables')
        pass
        for l_2_variable in l_1_variables:
            _loop_vars = {}
            pass
            t_4.extend((
                '- name: ',
                str(t_1(environment.getattr(l_2_variable, 'name'))),
                '\n',
            ))
            if (not t_2(environment.getattr(l_2_variable, 'value_from'))):
                pass
                t_4.extend((
                    '  valueFrom: ',
                    str(t_1(environment.getattr(l_2_variable, 'value_from'))),
                    '\n',
                ))
            else:
                pass
                t_4.extend((
                    '  value: ',
                    str(t_1(environment.getattr(l_2_variable, 'value'))),
                    '\n',
                ))
        l_2_variable = missing
        return concat(t_4)
    context.exported_vars.add('env')
    context.vars['env'] = l_0_env = Macro(environment, macro, 'env', ('variables',), False, False, False, context.eval_ctx.autoescape)

blocks = {}
debug_info = '6=24&7=31&8=34&9=38&11=43&12=46&13=50&17=57&18=62&19=67&20=70&21=74&23=81'